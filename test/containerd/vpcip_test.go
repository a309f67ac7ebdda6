package containerd_test

import (
	"testing"

	"github.com/vpcip/vpcip/test/containerd/crinode"
)

// vpcipBenchTargets returns the vpcip conflist's benchmark target.
func vpcipBenchTargets(b *testing.B, tools crinode.Tools) []benchTarget { return nil }
