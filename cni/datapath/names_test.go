package datapath

import (
	"crypto/sha1"
	"encoding/hex"
	"testing"
)

func TestHostVethName(t *testing.T) {
	sum := func(s string) string { h := sha1.Sum([]byte(s)); return hex.EncodeToString(h[:])[:11] }
	tests := []struct {
		prefix, ns, pod, cid, want string
	}{
		{"eni", "default", "web-0", "c1", "eni" + sum("default.web-0")},
		{"cali", "kube-system", "coredns-5d78c9869d-x2x7q", "c1", "cali" + sum("kube-system.coredns-5d78c9869d-x2x7q")},
		{"eni", "", "", "0123456789abcdef", "eni" + sum("0123456789abcdef")},
	}
	for _, tt := range tests {
		got := HostVethName(tt.prefix, tt.ns, tt.pod, tt.cid)
		if got != tt.want || len(got) > 15 {
			t.Errorf("HostVethName(%q,%q,%q,%q) = %q, want %q (≤15 bytes)", tt.prefix, tt.ns, tt.pod, tt.cid, got, tt.want)
		}
	}
	// A pinned value guards against an accidental change of the scheme,
	// which would orphan every existing pod's veth on upgrade.
	if got := HostVethName("eni", "default", "p1", ""); got != "eni182c452fe96" {
		t.Errorf("HostVethName(eni, default, p1) = %s, want eni182c452fe96", got)
	}
}

// TestAttachmentVethName: the default attachment (eth0) keeps the pod's
// name (Calico-style tooling computes it, and existing pods' veths keep
// theirs on upgrade); any other attachment of the pod gets a name of its
// own, different per interface and per network, within the kernel's limit.
func TestAttachmentVethName(t *testing.T) {
	sum := func(s string) string { h := sha1.Sum([]byte(s)); return hex.EncodeToString(h[:])[:11] }
	if got, want := AttachmentVethName("eni", "default", "web-0", "c1", "vpcip", "eth0"), HostVethName("eni", "default", "web-0", "c1"); got != want {
		t.Errorf("eth0: %s, want the pod's name %s", got, want)
	}
	if got, want := AttachmentVethName("eni", "default", "web-0", "c1", "vpcip", "net1"), "eni"+sum("default.web-0/vpcip/net1"); got != want {
		t.Errorf("net1: %s, want %s", got, want)
	}
	if got, want := AttachmentVethName("eni", "", "", "c1", "vpcip", "net1"), "eni"+sum("c1/vpcip/net1"); got != want {
		t.Errorf("net1 without a pod name: %s, want %s", got, want)
	}
	names := map[string]bool{}
	for _, a := range [][2]string{{"vpcip", "eth0"}, {"vpcip", "net1"}, {"vpcip", "net2"}, {"vpcip-b", "net1"}} {
		n := AttachmentVethName("cali", "kube-system", "coredns-5d78c9869d-x2x7q", "c1", a[0], a[1])
		if names[n] || len(n) > 15 {
			t.Errorf("%v: %s repeats another attachment's name or is longer than 15 bytes", a, n)
		}
		names[n] = true
	}
}
