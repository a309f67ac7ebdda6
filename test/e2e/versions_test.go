package e2e

import (
	"slices"
	"testing"

	"github.com/vpcip/vpcip/cni/plugin"
	"github.com/vpcip/vpcip/ipamd/config"
)

// install-cni may write only a cniVersion the plugin accepts: otherwise every
// ADD on the node fails with "incompatible CNI versions".
func TestInstallCNIVersionsMatchThePlugin(t *testing.T) {
	got := slices.Sorted(slices.Values(config.SupportedCNIVersions))
	want := slices.Sorted(slices.Values(plugin.Versions.SupportedVersions()))
	if !slices.Equal(got, want) {
		t.Errorf("VPCIP_CNI_VERSION accepts %v, the plugin speaks %v", got, want)
	}
}
