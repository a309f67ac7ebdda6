package vpcsim

import (
	_ "embed"
	"encoding/csv"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// limitsCSV holds the network limits of every EC2 instance type as EC2's
// DescribeInstanceTypes reports them (NetworkInfo, Hypervisor, BareMetal,
// ProcessorInfo.SupportedArchitectures).
//
//go:embed ec2-instance-network-limits.csv
var limitsCSV string

// InstanceType is the network side of one EC2 instance type, as
// DescribeInstanceTypes reports it.
type InstanceType struct {
	Name               string // e.g. "m5.large"
	Hypervisor         string // "nitro", "xen" or "" (bare metal)
	BareMetal          bool
	MaxENIs            int // ENIs the instance can have in total, all cards
	IPv4PerENI         int // IPv4 addresses per ENI, the primary included
	IPv6PerENI         int
	IPv6Supported      bool
	MaxNetworkCards    int
	DefaultNetworkCard int
	CardENIs           []int // maximum ENIs per network card, by card index
	Architectures      []string
}

// PrefixDelegation reports whether /28 prefixes may be assigned to ENIs of
// this type: EC2 allows them on Nitro and bare-metal instances only.
func (t InstanceType) PrefixDelegation() bool {
	return t.Hypervisor == "nitro" || t.BareMetal
}

// maxENIsOnCard is the number of ENIs that may be attached on network card
// card, or 0 when the type has no such card.
func (t InstanceType) maxENIsOnCard(card int) int {
	if card < 0 || card >= len(t.CardENIs) {
		return 0
	}
	return t.CardENIs[card]
}

var (
	typesOnce     sync.Once
	typesByName   map[string]InstanceType
	typeNames     []string // sorted
	typesErr      error
	maxIPv4PerENI int
	maxIPv6PerENI int
)

// LookupInstanceType returns the limits of the named EC2 instance type from
// the embedded table of real EC2 figures.
func LookupInstanceType(name string) (InstanceType, bool) {
	loadTypes()
	t, ok := typesByName[name]
	return t, ok
}

func loadTypes() {
	typesOnce.Do(func() {
		typesByName, typesErr = parseTypes(limitsCSV)
		for n, t := range typesByName {
			typeNames = append(typeNames, n)
			maxIPv4PerENI = max(maxIPv4PerENI, t.IPv4PerENI)
			maxIPv6PerENI = max(maxIPv6PerENI, t.IPv6PerENI)
		}
		sort.Strings(typeNames)
	})
}

// parseTypes reads the limits table (see ec2-instance-network-limits.csv's
// header for the columns).
func parseTypes(text string) (map[string]InstanceType, error) {
	r := csv.NewReader(strings.NewReader(text))
	rows, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("instance type table: %w", err)
	}
	if len(rows) < 2 || len(rows[0]) != 11 {
		return nil, fmt.Errorf("instance type table: unexpected header %v", rows[0])
	}
	out := make(map[string]InstanceType, len(rows)-1)
	for i, row := range rows[1:] {
		t, err := parseTypeRow(row)
		if err != nil {
			return nil, fmt.Errorf("instance type table line %d: %w", i+2, err)
		}
		out[t.Name] = t
	}
	return out, nil
}

func parseTypeRow(row []string) (InstanceType, error) {
	var t InstanceType
	var errs []error
	num := func(s string) int {
		n, err := strconv.Atoi(s)
		if err != nil {
			errs = append(errs, err)
		}
		return n
	}
	t.Name = row[0]
	t.Hypervisor = row[1]
	t.BareMetal = row[2] == "true"
	t.MaxENIs = num(row[3])
	t.IPv4PerENI = num(row[4])
	t.IPv6PerENI = num(row[5])
	t.IPv6Supported = row[6] == "true"
	t.MaxNetworkCards = num(row[7])
	t.DefaultNetworkCard = num(row[8])
	t.CardENIs = make([]int, t.MaxNetworkCards)
	for _, card := range strings.Split(row[9], ";") {
		idx, n, ok := strings.Cut(card, ":")
		if !ok {
			errs = append(errs, fmt.Errorf("network card %q", card))
			continue
		}
		ci := num(idx)
		if ci < 0 || ci >= len(t.CardENIs) {
			errs = append(errs, fmt.Errorf("network card index %d", ci))
			continue
		}
		t.CardENIs[ci] = num(n)
	}
	if row[10] != "" {
		t.Architectures = strings.Split(row[10], ";")
	}
	if len(errs) > 0 {
		return t, fmt.Errorf("%s: %v", t.Name, errs[0])
	}
	return t, nil
}
