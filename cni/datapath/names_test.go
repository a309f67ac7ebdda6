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
