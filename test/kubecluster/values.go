package kubecluster

import (
	"fmt"
	"os"

	"gopkg.in/yaml.v3"

	"github.com/vpcip/vpcip/ipamd/config"
)

// WantConfigFromValues returns the settings of a values file's env block that
// the daemon reads, as its effective configuration must show them: under the
// variable's own name (an alias such as AWS_VPC_K8S_PLUGIN_LOG_LEVEL shows as
// VPCIP_PLUGIN_LOG_LEVEL), unless the block also sets that name, which wins.
func WantConfigFromValues(path string) (map[string]string, error) {
	if path == "" {
		return nil, nil
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
	want := map[string]string{}
	for _, cv := range config.Vars {
		for _, n := range append([]string{cv.Name}, cv.Aliases...) {
			if val, ok := v.Env[n]; ok {
				want[cv.Name] = val
				break
			}
		}
	}
	return want, nil
}
