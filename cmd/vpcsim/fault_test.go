package main

import (
	"encoding/json"
	"testing"
)

func TestFaultBodies(t *testing.T) {
	tests := []struct {
		fault string
		args  []string
		want  string // JSON body; "" = refused
	}{
		{"latency", []string{"AttachNetworkInterface", "200ms", "50ms"}, `{"fixed":"200ms","jitter":"50ms","op":"AttachNetworkInterface"}`},
		{"latency", []string{"*", "1s"}, `{"fixed":"1s","jitter":"0s","op":""}`},
		{"latency", []string{"X", "soon"}, ""}, // not a duration
		{"latency", []string{"X", "-1s"}, ""},  // negative
		{"error-rate", []string{"AssignPrivateIpAddresses", "0.2", "InsufficientFreeAddressesInSubnet"}, `{"code":"InsufficientFreeAddressesInSubnet","op":"AssignPrivateIpAddresses","rate":0.2}`},
		{"error-rate", []string{"X", "1.5", "C"}, ""}, // rate above 1
		{"fail-next", []string{"*", "RequestLimitExceeded"}, `{"code":"RequestLimitExceeded","op":""}`},
		{"throttle", []string{"mutating", "5", "10"}, `{"burst":10,"mutating":true,"perSecond":5}`},
		{"throttle", []string{"describe", "0", "0"}, `{"burst":0,"mutating":false,"perSecond":0}`},
		{"throttle", []string{"writes", "5", "10"}, ""}, // neither mutating nor describe
		{"throttle", []string{"mutating", "5", "-1"}, ""},
		{"imds-lag", []string{"2s"}, `{"lag":"2s"}`},
		{"request-limits", []string{"aws"}, `{"aws":true}`},
		{"request-limits", []string{"off"}, `{"off":true}`},
		{"request-limits", []string{"AssignPrivateIpAddresses", "100", "5"}, `{"limits":{"AssignPrivateIpAddresses":{"capacity":100,"refillPerSecond":5}}}`},
		{"request-limits", []string{"AssignPrivateIpAddresses", "0.5", "5"}, ""}, // capacity below one token
		{"request-limits", []string{"AssignPrivateIpAddresses", "100", "0"}, ""},
		{"request-limits", []string{"on"}, ""},
	}
	for _, tt := range tests {
		v, err := faults[tt.fault].body(tt.args)
		if tt.want == "" {
			if err == nil {
				t.Errorf("%s %v: accepted (%v), want an error", tt.fault, tt.args, v)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s %v: %v", tt.fault, tt.args, err)
			continue
		}
		got, _ := json.Marshal(v)
		if string(got) != tt.want {
			t.Errorf("%s %v: body %s, want %s", tt.fault, tt.args, got, tt.want)
		}
	}
}
