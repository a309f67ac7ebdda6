package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

const header = "instance_type,hypervisor,bare_metal,max_network_interfaces,ipv4_addresses_per_interface,ipv6_addresses_per_interface,ipv6_supported,maximum_network_cards,default_network_card_index,network_cards,architectures\n"

func TestParse(t *testing.T) {
	csv := header +
		"x9.large,nitro,false,16,50,50,true,2,1,0:4;1:12,x86_64\n" +
		"a1.small,xen,false,2,4,4,true,1,0,0:2,arm64\n"
	rows, err := parse(strings.NewReader(csv))
	if err != nil {
		t.Fatal(err)
	}
	want := []row{
		{instanceType: "a1.small", maxENIs: 2, ipv4PerENI: 4, hypervisor: "xen"},
		{instanceType: "x9.large", maxENIs: 12, ipv4PerENI: 50, hypervisor: "nitro"}, // default card 1 holds 12
	}
	if len(rows) != len(want) {
		t.Fatalf("parse = %+v, want %+v", rows, want)
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d = %+v, want %+v", i, rows[i], want[i])
		}
	}
}

func TestParseRejects(t *testing.T) {
	tests := map[string]string{
		"no default card entry": "x.large,nitro,false,4,10,10,true,2,1,0:4,x86_64\n",
		"bad card entry":        "x.large,nitro,false,4,10,10,true,1,0,0-4,x86_64\n",
		"zero addresses":        "x.large,nitro,false,4,0,10,true,1,0,0:4,x86_64\n",
		"bad bare_metal":        "x.large,nitro,maybe,4,10,10,true,1,0,0:4,x86_64\n",
		"duplicate":             "x.large,nitro,false,4,10,10,true,1,0,0:4,x86_64\nx.large,nitro,false,4,10,10,true,1,0,0:4,x86_64\n",
		"empty type":            ",nitro,false,4,10,10,true,1,0,0:4,x86_64\n",
	}
	for name, body := range tests {
		if _, err := parse(strings.NewReader(header + body)); err == nil {
			t.Errorf("%s: parse accepted %q", name, body)
		}
	}
	if _, err := parse(strings.NewReader(header)); err == nil {
		t.Errorf("parse accepted a table without rows")
	}
}

// TestTableIsCurrent fails when limits_table.go was not regenerated after
// the CSV or the generator changed (run go generate ./provider/aws).
func TestTableIsCurrent(t *testing.T) {
	f, err := os.Open("../../../../test/vpcsim/ec2-instance-network-limits.csv") // the one copy (vpcsim embeds it)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := parse(f)
	if err != nil {
		t.Fatal(err)
	}
	want, err := render("awsprovider", rows)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../limits_table.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("limits_table.go differs from what limitsgen makes of the CSV; run go generate ./provider/aws")
	}
}
