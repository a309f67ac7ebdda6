package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// Expected figures: eni-max-pods.txt of amazon-eks-ami for secondary IPs
// (m5.large 29, c5.18xlarge capped 250 from 737, t3.medium 17), and the
// calculator's prefix-mode rule (m5.large 3×9×16+2 = 434 → 110).
func TestMaxPods(t *testing.T) {
	tests := []struct {
		args []string
		want string // the table's data row, fields joined by one space
	}{
		{[]string{"--instance-type", "m5.large"}, "m5.large secondary-ip 3 9 29 2 29"},
		{[]string{"--instance-type", "t3.medium"}, "t3.medium secondary-ip 3 5 17 2 17"},
		{[]string{"--instance-type", "m5.large", "--prefix-delegation"}, "m5.large prefix 3 144 434 2 110"},
		{[]string{"--instance-type", "m5.large", "--custom-networking"}, "m5.large secondary-ip 2 9 20 2 20"},
		{[]string{"--instance-type", "m5.large", "--prefix-delegation", "--custom-networking"}, "m5.large prefix 2 144 290 2 110"},
		{[]string{"--instance-type", "c5.18xlarge"}, "c5.18xlarge secondary-ip 15 49 737 72 250"},
		{[]string{"--instance-type", "m5.8xlarge", "--prefix-delegation"}, "m5.8xlarge prefix 8 464 3714 32 250"},
		{[]string{"--instance-type", "m5.4xlarge"}, "m5.4xlarge secondary-ip 8 29 234 16 110"},
		{[]string{"--instance-type", "m5.large", "--max-eni", "2"}, "m5.large secondary-ip 2 9 20 2 20"},
		{[]string{"--instance-type", "c5.metal", "--vcpus", "96"}, "c5.metal secondary-ip 15 49 737 96 250"},
		{[]string{"--instance-type", "c4.large", "--prefix-delegation"}, "c4.large secondary-ip 3 9 29 2 29"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, errOut, code := runCtl(t, append([]string{"max-pods"}, tt.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if got := strings.Join(strings.Fields(lines[1]), " "); got != tt.want {
				t.Errorf("row %q, want %q\n%s", got, tt.want, out)
			}
		})
	}
}

func TestMaxPodsJSONAndErrors(t *testing.T) {
	out, _, code := runCtl(t, "-o", "json", "max-pods", "--instance-type", "m5.large")
	var m MaxPods
	if code != 0 || json.Unmarshal([]byte(out), &m) != nil || m.MaxPods != 29 || m.AddressLimit != 29 || m.Ceiling != 110 {
		t.Errorf("json: exit %d, %+v\n%s", code, m, out)
	}
	for _, tt := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"max-pods"}, exitUsage, "usage"},
		{[]string{"max-pods", "--instance-type", "z9.huge"}, exitFail, "not in the built-in limits table"},
		{[]string{"max-pods", "--instance-type", "c5.metal"}, exitFail, "--vcpus"},
		{[]string{"max-pods", "--instance-type", "m5.large", "--max-eni", "-1"}, exitUsage, "usage"},
	} {
		_, errOut, code := runCtl(t, tt.args...)
		if code != tt.code || !strings.Contains(errOut, tt.msg) {
			t.Errorf("%q: exit %d (want %d), stderr %q (want %q)", tt.args, code, tt.code, errOut, tt.msg)
		}
	}
}
