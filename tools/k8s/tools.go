//go:build tools

// Package k8stools pins the Kubernetes release whose binaries vpcip's test
// clusters run (kube-apiserver, kube-controller-manager, kube-scheduler,
// kubelet, kubectl). It is a module of its own so that vpcip's go.mod never
// requires k8s.io/kubernetes; scripts/k8s-tools.sh builds from here.
package k8stools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
