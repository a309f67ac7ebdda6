package kubecluster

import (
	"fmt"
	"os"
	"slices"

	"gopkg.in/yaml.v3"

	"github.com/vpcip/vpcip/ipamd/config"
)

// WantConfigFromValues returns the settings of a values file's env block that
// the daemon reads, as its effective configuration must show them.
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
	for k, val := range v.Env {
		if slices.Contains(config.Names(), k) {
			want[k] = val
		}
	}
	return want, nil
}
