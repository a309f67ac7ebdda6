package vpcsim

import (
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// maxListEntries bounds the entries of one list parameter (Filter.N,
// PrivateIpAddress.N, ...), so that a hostile request cannot make the
// handler do unbounded work.
const maxListEntries = 1000

// params is a parsed EC2 Query request: form keys such as
// "NetworkInterfaceId.1", "Filter.2.Value.1", "TagSpecification.1.Tag.1.Key".
type params url.Values

func (p params) get(k string) string {
	if v := p[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (p params) required(k string) (string, *Error) {
	v := p.get(k)
	if v == "" {
		return "", errMissing(k)
	}
	return v, nil
}

// indexed returns the distinct "prefix.N" bases present in the request
// (N a positive integer, any sub-key), ordered by N.
func (p params) indexed(prefix string) ([]string, *Error) {
	type base struct {
		n    int
		name string
	}
	var bases []base
	seen := map[int]bool{}
	for k := range p {
		rest, ok := strings.CutPrefix(k, prefix+".")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ".")
		n, err := strconv.Atoi(num)
		if err != nil || n < 1 {
			return nil, errorf("InvalidParameterValue", "The parameter %s has an invalid index %q.", prefix, num)
		}
		if !seen[n] {
			seen[n] = true
			bases = append(bases, base{n, prefix + "." + num})
		}
	}
	if len(bases) > maxListEntries {
		return nil, errorf("InvalidParameterValue", "Too many %s entries: %d (at most %d).", prefix, len(bases), maxListEntries)
	}
	slices.SortFunc(bases, func(a, b base) int { return a.n - b.n })
	out := make([]string, len(bases))
	for i, b := range bases {
		out[i] = b.name
	}
	return out, nil
}

// list returns the values of "prefix.N" keys, ordered by N.
func (p params) list(prefix string) ([]string, *Error) {
	bases, err := p.indexed(prefix)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(bases))
	for _, b := range bases {
		if v, ok := p[b]; ok && len(v) > 0 {
			out = append(out, v[0])
		}
	}
	return out, nil
}

// intParam parses an optional integer parameter within [lo, hi]; absent gives def.
func (p params) intParam(k string, def, lo, hi int) (int, *Error) {
	s := p.get(k)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, errBadValue(k, s, "Expected an integer between "+itoa(lo)+" and "+itoa(hi)+".")
	}
	return n, nil
}

// boolParam parses an optional boolean parameter ("true"/"false").
func (p params) boolParam(k string, def bool) (bool, *Error) {
	switch s := p.get(k); strings.ToLower(s) {
	case "":
		return def, nil
	case "true":
		return true, nil
	case "false":
		return false, nil
	default:
		return false, errBadValue(k, s, "Expected true or false.")
	}
}

func parseAddr(k, s string) (netip.Addr, *Error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return netip.Addr{}, errorf("InvalidParameterValue", "Invalid IPv4 address %q for %s.", s, k)
	}
	return a, nil
}

// addrList parses the "prefix.N" IPv4 addresses.
func (p params) addrList(prefix string) ([]netip.Addr, *Error) {
	vals, err := p.list(prefix)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(vals))
	for _, s := range vals {
		a, err := parseAddr(prefix, s)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// prefixList parses IPv4 prefixes from "prefix.N" (sub = "") or
// "prefix.N.sub" keys.
func (p params) prefixList(prefix, sub string) ([]netip.Prefix, *Error) {
	bases, err := p.indexed(prefix)
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, b := range bases {
		k := b
		if sub != "" {
			k += "." + sub
		}
		s := p.get(k)
		if s == "" {
			continue
		}
		pf, perr := netip.ParsePrefix(s)
		if perr != nil || !pf.Addr().Is4() {
			return nil, errorf("InvalidParameterValue", "Invalid IPv4 prefix %q for %s.", s, k)
		}
		out = append(out, pf)
	}
	return out, nil
}

// tags parses "prefix.N.Key" / "prefix.N.Value" pairs.
func (p params) tags(prefix string) (map[string]string, []string, *Error) {
	bases, err := p.indexed(prefix)
	if err != nil {
		return nil, nil, err
	}
	out := map[string]string{}
	var keys []string
	for _, b := range bases {
		k := p.get(b + ".Key")
		if k == "" {
			return nil, nil, errMissing(b + ".Key")
		}
		if len(k) > 128 || len(p.get(b+".Value")) > 256 {
			return nil, nil, errorf("InvalidParameterValue", "Tag %q is too long.", k)
		}
		out[k] = p.get(b + ".Value")
		keys = append(keys, k)
	}
	return out, keys, nil
}

// tagSpecs parses TagSpecification.N for one resource type and returns the
// tags to apply.
func (p params) tagSpecs(resourceType string) (map[string]string, *Error) {
	bases, err := p.indexed("TagSpecification")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, b := range bases {
		if rt := p.get(b + ".ResourceType"); rt != resourceType {
			return nil, errBadValue(b+".ResourceType", rt, "Expected "+resourceType+".")
		}
		t, _, err := p.tags(b + ".Tag")
		if err != nil {
			return nil, err
		}
		for k, v := range t {
			out[k] = v
		}
	}
	if err := checkTags(out); err != nil {
		return nil, err
	}
	return out, nil
}

// filter is one Filter.N: a name and the values any of which may match.
type filter struct {
	name   string
	values []string
}

func (p params) filters() ([]filter, *Error) {
	bases, err := p.indexed("Filter")
	if err != nil {
		return nil, err
	}
	out := make([]filter, 0, len(bases))
	for _, b := range bases {
		name := p.get(b + ".Name")
		if name == "" {
			return nil, errMissing(b + ".Name")
		}
		vals, err := p.list(b + ".Value")
		if err != nil {
			return nil, err
		}
		out = append(out, filter{name: name, values: vals})
	}
	return out, nil
}
