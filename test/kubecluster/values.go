package kubecluster

import (
	"fmt"
	"maps"
	"os"

	"gopkg.in/yaml.v3"

	"github.com/vpcip/vpcip/ipamd/config"
)

// WantConfigFromValues returns the settings of the values files' env blocks
// (merged in order, later files winning key by key, as `helm install -f a -f
// b` merges them) that the daemon reads, as its effective configuration must
// show them: under the variable's own name (an alias such as
// AWS_VPC_K8S_PLUGIN_LOG_LEVEL shows as VPCIP_PLUGIN_LOG_LEVEL), unless the
// blocks also set that name, which wins. Empty paths are skipped.
func WantConfigFromValues(paths ...string) (map[string]string, error) {
	env := map[string]string{}
	for _, path := range paths {
		if path == "" {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var v struct {
			Env map[string]string `yaml:"env"`
		}
		if err := yaml.Unmarshal(data, &v); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		maps.Copy(env, v.Env)
	}
	if len(env) == 0 {
		return nil, nil
	}
	want := map[string]string{}
	for _, cv := range config.Vars {
		for _, n := range append([]string{cv.Name}, cv.Aliases...) {
			if val, ok := env[n]; ok {
				want[cv.Name] = val
				break
			}
		}
	}
	return want, nil
}
