package kubecluster

import (
	"strings"
	"testing"
	"time"
)

func TestNodeByNode(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(1000+int64(s), 0) }
	tests := []struct {
		name    string
		pods    []Pod
		wantErr string
	}{
		{"second created after the first was ready", []Pod{
			{Name: "a", Node: "node-1", Created: at(0), ReadySince: at(5)},
			{Name: "b", Node: "node-2", Created: at(6), ReadySince: at(9)},
		}, ""},
		{"both replaced at once", []Pod{
			{Name: "a", Node: "node-1", Created: at(0), ReadySince: at(5)},
			{Name: "b", Node: "node-2", Created: at(1), ReadySince: at(6)},
		}, "before a (node-1) was ready"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := nodeByNode(tt.pods)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("nodeByNode = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestSameAddresses(t *testing.T) {
	before := []Pod{{Name: "a", UID: "1", IP: "100.64.0.10", Phase: "Running"}, {Name: "b", UID: "2", IP: "100.64.0.11", Phase: "Running"}}
	if err := sameAddresses(before, before); err != nil {
		t.Errorf("unchanged pods: %v", err)
	}
	moved := []Pod{before[0], {Name: "b", UID: "2", IP: "100.64.0.12", Phase: "Running"}}
	if err := sameAddresses(before, moved); err == nil || !strings.Contains(err.Error(), "pod b") {
		t.Errorf("a pod with a new address: %v", err)
	}
	replaced := []Pod{before[0], {Name: "c", UID: "3", IP: "100.64.0.11", Phase: "Running"}}
	if err := sameAddresses(before, replaced); err == nil || !strings.Contains(err.Error(), "new after the upgrade") {
		t.Errorf("a replaced pod: %v", err)
	}
}

func TestParseConfig(t *testing.T) {
	got, err := parseConfig(`{"ready":true,"config":{"WARM_IP_TARGET":"5"}}`)
	if err != nil || got["WARM_IP_TARGET"] != "5" {
		t.Errorf("parseConfig = %v, %v", got, err)
	}
	if _, err := parseConfig("vpcipctl: connection refused"); err == nil {
		t.Error("parseConfig accepted a non-JSON answer")
	}
}
