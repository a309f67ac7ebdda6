package eniconfig_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcip/vpcip/ipamd/eniconfig"
	"github.com/vpcip/vpcip/ipamd/podsubnet"
	"github.com/vpcip/vpcip/test/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

var crd = filepath.Join("..", "..", "charts", "vpcip", "crds", "eniconfigs.crd.k8s.amazonaws.com.yaml")

// eventually polls f until it reports true or 20 s pass.
func eventually(t *testing.T, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, got := f()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: last seen %s", what, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNodeSelectsENIConfig runs against a real kube-apiserver: the chart's
// CRD takes the reference's ENIConfig YAML unchanged (kubectl apply) and
// refuses one without a subnet; the node's ENIConfig follows its zone label
// (ENI_CONFIG_LABEL_DEF=topology.kubernetes.io/zone), then the
// externalEniConfig label; a missing one is ErrNoENIConfig naming it.
func TestNodeSelectsENIConfig(t *testing.T) {
	k := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.ApplyFiles(ctx, crd); err != nil {
		t.Fatal(err)
	}
	if out, err := k.Kubectl(ctx, "apply", "-f", filepath.Join("testdata", "reference-eniconfigs.yaml")); err != nil {
		t.Fatalf("kubectl apply of the reference ENIConfigs: %v\n%s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "no-subnet.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: crd.k8s.amazonaws.com/v1alpha1\nkind: ENIConfig\nmetadata: {name: no-subnet}\nspec: {securityGroups: [sg-1]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := k.Kubectl(ctx, "apply", "-f", bad); err == nil || !strings.Contains(err.Error(), "spec.subnet") {
		t.Errorf("an ENIConfig without spec.subnet was accepted: %v %s", err, out)
	}

	cs := kubernetes.NewForConfigOrDie(k.Config)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "eniconfig-node", Labels: map[string]string{"topology.kubernetes.io/zone": "us-west-2a"}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	var changes atomic.Int32
	src, err := eniconfig.New(eniconfig.Options{Config: k.Config, NodeName: node.Name,
		Keys: podsubnet.NodeKeys{Label: "topology.kubernetes.io/zone"}, Changed: func() { changes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := src.NodeENIConfig(); !errors.Is(err, podsubnet.ErrNoENIConfig) {
		t.Errorf("before the caches synced: err = %v, want ErrNoENIConfig", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go src.Run(runCtx)

	want := func(name, subnet string, groups []string, source string) {
		t.Helper()
		eventually(t, "node's ENIConfig "+name, func() (bool, string) {
			cfg, from, err := src.NodeENIConfig()
			got := cfg.Name + " " + cfg.Subnet + " " + strings.Join(cfg.SecurityGroups, ",") + " (" + from + ")"
			if err != nil {
				got += ": " + err.Error()
			}
			return err == nil && cfg.Name == name && cfg.Subnet == subnet && slices.Equal(cfg.SecurityGroups, groups) && from == source, got
		})
	}
	want("us-west-2a", "subnet-0000000000000a002", []string{"sg-0000000000000a001"}, "label topology.kubernetes.io/zone")

	node, _ = cs.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
	node.Labels["vpc.amazonaws.com/externalEniConfig"] = "us-west-2b"
	if _, err := cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("us-west-2b", "subnet-0000000000000b002", nil, "label vpc.amazonaws.com/externalEniConfig")

	node, _ = cs.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
	node.Labels["vpc.amazonaws.com/externalEniConfig"] = "nonesuch"
	if _, err := cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a missing ENIConfig", func() (bool, string) {
		_, _, err := src.NodeENIConfig()
		return errors.Is(err, podsubnet.ErrNoENIConfig) && strings.Contains(fmtErr(err), `"nonesuch"`), fmtErr(err)
	})
	if changes.Load() == 0 {
		t.Error("Changed was never called")
	}
}

func fmtErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
