//go:build tools

// Package k8stools pins the Kubernetes release whose binaries vpcip's test
// clusters run (kube-apiserver, kube-controller-manager, kube-scheduler,
// kubelet, kubectl) and the Helm 3 and Helm 4 releases the chart is tested
// with. It is a module of its own so that vpcip's go.mod never requires
// k8s.io/kubernetes; scripts/k8s-tools.sh builds from here. One module for
// all seven: they share one build of the Kubernetes client libraries
// (k8s.io/* at the pinned release), which a cold build then compiles once
// instead of three times.
package k8stools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"

	_ "helm.sh/helm/v3/cmd/helm"
	_ "helm.sh/helm/v4/cmd/helm"
)
