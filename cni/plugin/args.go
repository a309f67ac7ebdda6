package plugin

import (
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcip/vpcip/ipamd/api"
)

// PodArgs are the Kubernetes keys a runtime passes in CNI_ARGS
// ("K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;...").
type PodArgs struct {
	Namespace        string // K8S_POD_NAMESPACE
	Name             string // K8S_POD_NAME
	UID              string // K8S_POD_UID
	InfraContainerID string // K8S_POD_INFRA_CONTAINER_ID
}

// maxArgsBytes bounds CNI_ARGS; the kernel's environment limit is far above
// anything a runtime sends.
const maxArgsBytes = 64 << 10

// ParseArgs parses CNI_ARGS: pairs KEY=VALUE separated by ';'. Unknown keys
// (IgnoreUnknown, K8S_POD_UID on old runtimes, anything a runtime adds) are
// ignored; an empty string gives zero PodArgs. A pair without '=' or with an
// empty key is an error with CNI code 4 (invalid environment variables)
// naming the pair, as is a pod namespace, name or UID over
// api.MaxPodField bytes.
func ParseArgs(s string) (PodArgs, error) {
	var a PodArgs
	if len(s) > maxArgsBytes {
		return a, types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("CNI_ARGS is %d bytes, more than the %d accepted", len(s), maxArgsBytes), "")
	}
	if s == "" {
		return a, nil
	}
	for i, pair := range strings.Split(s, ";") {
		if pair == "" {
			continue // "A=1;" and ";;" are harmless
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return PodArgs{}, types.NewError(types.ErrInvalidEnvironmentVariables,
				fmt.Sprintf("CNI_ARGS pair %d %q is not KEY=VALUE", i+1, pair), "")
		}
		switch k {
		case "K8S_POD_NAMESPACE":
			a.Namespace = v
		case "K8S_POD_NAME":
			a.Name = v
		case "K8S_POD_UID":
			a.UID = v
		case "K8S_POD_INFRA_CONTAINER_ID":
			a.InfraContainerID = v
		}
	}
	if err := (api.Pod{Namespace: a.Namespace, Name: a.Name, UID: a.UID}).Check(); err != nil {
		return PodArgs{}, types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_ARGS: "+err.Error(), "")
	}
	return a, nil
}
