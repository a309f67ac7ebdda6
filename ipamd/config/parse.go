package config

import (
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// parser reads variables and collects one error per bad value.
type parser struct {
	getenv func(string) string
	errs   []error
}

func (p *parser) fail(name, value, form string) {
	p.errs = append(p.errs, fmt.Errorf("%s=%q: want %s", name, value, form))
}

// setName is the name to read for v: v.Name, or the first of its aliases
// that is set when v.Name is not (so an error names what the operator set).
func (p *parser) setName(v Var) string {
	if _, ok := p.get(v.Name); ok {
		return v.Name
	}
	for _, a := range v.Aliases {
		if _, ok := p.get(a); ok {
			return a
		}
	}
	return v.Name
}

func (p *parser) get(name string) (string, bool) {
	v := strings.TrimSpace(p.getenv(name))
	return v, v != ""
}

// count is a non-negative integer.
func (p *parser) count(name string, def int) int {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		p.fail(name, v, "a whole number ≥ 0")
		return def
	}
	return n
}

func (p *parser) intRange(name string, def, lo, hi int) int {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		p.fail(name, v, fmt.Sprintf("a whole number from %d to %d", lo, hi))
		return def
	}
	return n
}

// maxENI accepts the AWS VPC CNI's -1 (no cap) as well as 0.
func (p *parser) maxENI(name string) int {
	v, ok := p.get(name)
	if !ok || v == "-1" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		p.fail(name, v, "a whole number ≥ 1, or -1 for the instance type's limit")
		return 0
	}
	return n
}

func (p *parser) boolean(name string, def bool) bool {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		p.fail(name, v, "true or false")
		return def
	}
	return b
}

// seconds is a whole number of seconds (the AWS VPC CNI form), or a Go
// duration such as "30s".
func (p *parser) seconds(name string, def time.Duration) time.Duration {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return d
	}
	p.fail(name, v, "a whole number of seconds ≥ 0 (or a duration like 30s)")
	return def
}

// duration is a Go duration ("500ms", "2m") of at least min.
func (p *parser) duration(name string, def, min time.Duration) time.Duration {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < min {
		p.fail(name, v, fmt.Sprintf("a duration like 10s or 2m, at least %s", min))
		return def
	}
	return d
}

// durationWhy is duration whose minimum has a reason, given in the error.
func (p *parser) durationWhy(name string, def, min time.Duration, why string) time.Duration {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < min {
		p.fail(name, v, fmt.Sprintf("a duration like 30s or 2m, at least %s: %s", min, why))
		return def
	}
	return d
}

func (p *parser) cidrs(name string) []netip.Prefix {
	v, ok := p.get(name)
	if !ok {
		return nil
	}
	var out []netip.Prefix
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(f)
		if err != nil || !pfx.Addr().Is4() {
			p.fail(name, v, "comma-separated IPv4 CIDRs like 10.0.0.0/8,192.168.0.0/16")
			return nil
		}
		out = append(out, pfx.Masked())
	}
	return out
}

// randomizeSNAT reads AWS_VPC_K8S_CNI_RANDOMIZESNAT: "prng" (the default),
// "hashrandom" or "none", in any case.
func (p *parser) randomizeSNAT(name string) string {
	v, ok := p.get(name)
	if !ok {
		return "prng"
	}
	switch v = strings.ToLower(v); v {
	case "prng", "hashrandom", "none":
		return v
	}
	p.fail(name, v, "prng, hashrandom or none")
	return "prng"
}

// vethPrefix must leave room for the 11 hex digits of the host veth name in
// the kernel's 15 characters, and must not shadow the node's own links.
func (p *parser) vethPrefix(name, def string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	bad := len(v) > 4 || slices.Contains([]string{"eth", "vlan", "lo"}, v) ||
		strings.ContainsFunc(v, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
		})
	if bad {
		p.fail(name, v, "1 to 4 letters, digits, '-' or '_', not eth, vlan or lo")
		return def
	}
	return v
}

func (p *parser) logLevel(name string, def slog.Level) slog.Level {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	switch strings.ToUpper(v) {
	case "DEBUG", "TRACE":
		return slog.LevelDebug
	case "INFO":
		return slog.LevelInfo
	case "WARN", "WARNING":
		return slog.LevelWarn
	case "ERROR", "FATAL":
		return slog.LevelError
	}
	p.fail(name, v, "DEBUG, INFO, WARN or ERROR")
	return def
}

// name is a tag-safe identifier.
func (p *parser) name(name, def string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	if len(v) > 128 || strings.ContainsAny(v, " \t\n/=") {
		p.fail(name, v, "up to 128 characters without spaces, '/' or '='")
		return def
	}
	return v
}

func (p *parser) path(name, def string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	if !filepath.IsAbs(v) {
		p.fail(name, v, "an absolute path")
		return def
	}
	return filepath.Clean(v)
}

func (p *parser) optionalPath(name string) string {
	v, ok := p.get(name)
	if !ok {
		return ""
	}
	return p.path(name, v)
}

// addr is host:port, or "off" (returned as "").
func (p *parser) addr(name, def string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	if v == "off" {
		return ""
	}
	host, port, err := splitHostPort(v)
	if err != nil || (host != "" && !validHost(host)) || port < 0 || port > 65535 {
		p.fail(name, v, "host:port such as 127.0.0.1:61679 or :61678, or off")
		return def
	}
	return v
}

func splitHostPort(v string) (string, int, error) {
	i := strings.LastIndexByte(v, ':')
	if i < 0 {
		return "", 0, fmt.Errorf("no port")
	}
	port, err := strconv.Atoi(v[i+1:])
	if err != nil {
		return "", 0, err
	}
	return strings.Trim(v[:i], "[]"), port, nil
}

func validHost(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	return h == "localhost"
}

func (p *parser) oneOf(name, def string, allowed []string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	for _, a := range allowed {
		if strings.EqualFold(a, v) {
			return a
		}
	}
	p.fail(name, v, "one of "+strings.Join(allowed, ", "))
	return def
}

// qualifiedNameRE is a Kubernetes label or annotation key's name part:
// alphanumeric at both ends, '-', '_' and '.' inside, at most 63 characters.
var qualifiedNameRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// dnsSubdomainRE is a key prefix: lower-case DNS labels joined by dots.
var dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// labelKey reads a Kubernetes label or annotation key: an optional DNS
// subdomain prefix (at most 253 characters) and '/', then a name of at most
// 63 characters (Kubernetes "qualified name").
func (p *parser) labelKey(name, def string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	prefix, key, hasPrefix := strings.Cut(v, "/")
	if !hasPrefix {
		prefix, key = "", v
	}
	if !qualifiedNameRE.MatchString(key) || (hasPrefix && (len(prefix) > 253 || !dnsSubdomainRE.MatchString(prefix))) {
		p.fail(name, v, "a Kubernetes label or annotation key such as topology.kubernetes.io/zone")
		return def
	}
	return v
}

// namespaceRE is a Kubernetes namespace name (a DNS-1123 label).
var namespaceRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// namespaces is a comma-separated list of namespace names, sorted, without
// duplicates; unset is none.
func (p *parser) namespaces(name string) []string {
	v, ok := p.get(name)
	if !ok {
		return nil
	}
	var out []string
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if !namespaceRE.MatchString(f) {
			p.fail(name, v, "comma-separated namespace names (lower-case DNS labels)")
			return nil
		}
		out = append(out, f)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
