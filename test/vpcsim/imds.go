package vpcsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// imdsHistoryLen bounds the remembered network views per instance; IMDS lag
// looks back through them.
const imdsHistoryLen = 512

// imdsMaxTTL is IMDSv2's largest token lifetime, 6 hours.
const imdsMaxTTL = 21600

type imdsState struct {
	history map[string][]imdsSnapshot // by instance id, oldest first
	tokens  map[string]imdsToken
}

func (s *imdsState) init() {
	s.history = map[string][]imdsSnapshot{}
	s.tokens = map[string]imdsToken{}
}

type imdsToken struct {
	instanceID string
	expires    time.Time
}

type imdsSnapshot struct {
	at   time.Time
	view imdsView
}

// imdsView is what IMDS knows of an instance at one moment: copies, so that
// recording one per change is cheap and later changes do not show through.
type imdsView struct {
	id, typ, az, region, vpcID string
	launched                   time.Time
	vpcCIDRs                   []netip.Prefix
	vpcIPv6                    netip.Prefix // not valid without IPv6
	enis                       []imdsENI
}

type imdsENI struct {
	id, mac, subnetID  string
	subnetCIDR         netip.Prefix
	device, card       int
	primaryDevice      bool
	primary            netip.Addr
	secondaries        []netip.Addr
	prefixes           []netip.Prefix
	subnetIPv6         netip.Prefix // not valid without IPv6
	ipv6               []netip.Addr
	ipv6Prefixes       []netip.Prefix
	groups, groupNames []string
}

// recordIMDSLocked remembers the instance's metadata as it is now; IMDS
// serves it once the configured lag has passed.
func (c *Cloud) recordIMDSLocked(inst *instance) {
	if inst == nil {
		return
	}
	v := imdsView{id: inst.id, typ: inst.typ, az: inst.az, region: c.cfg.Region, vpcID: c.vpc.id,
		launched: inst.launched, vpcCIDRs: c.vpc.cidrs, vpcIPv6: c.vpc.ipv6}
	for _, e := range inst.enis {
		if e.attachStatus != "attached" {
			continue
		}
		ie := imdsENI{
			id: e.id, mac: e.mac, subnetID: e.subnetID, subnetCIDR: c.subnets[e.subnetID].cidr,
			device: e.deviceIndex, card: e.networkCard,
			primaryDevice: e.deviceIndex == 0 && e.networkCard == inst.itype.DefaultNetworkCard,
			primary:       e.primary, secondaries: slices.Clone(e.secondaries), prefixes: slices.Clone(e.prefixes),
			groups:     e.groups,
			subnetIPv6: c.subnets[e.subnetID].ipv6CIDR(), ipv6: slices.Clone(e.ipv6), ipv6Prefixes: slices.Clone(e.ipv6Prefixes),
		}
		for _, g := range e.groups {
			ie.groupNames = append(ie.groupNames, c.groups[g].name)
		}
		v.enis = append(v.enis, ie)
	}
	h := append(c.imds.history[inst.id], imdsSnapshot{at: time.Now(), view: v})
	if len(h) > imdsHistoryLen {
		h = slices.Delete(h, 0, len(h)-imdsHistoryLen)
	}
	c.imds.history[inst.id] = h
}

// tree builds every metadata leaf of the view: "meta-data/instance-id" → value.
func (v *imdsView) tree() map[string]string {
	t := map[string]string{
		"meta-data/instance-id":                 v.id,
		"meta-data/instance-type":               v.typ,
		"meta-data/ami-id":                      "ami-0123456789abcdef0",
		"meta-data/placement/availability-zone": v.az,
		"meta-data/placement/region":            v.region,
		"meta-data/services/domain":             "amazonaws.com",
	}
	cidrs := prefixStrings(v.vpcCIDRs)
	for _, e := range v.enis {
		addrs := []string{e.primary.String()}
		for _, a := range e.secondaries {
			addrs = append(addrs, a.String())
		}
		if e.primaryDevice {
			t["meta-data/mac"] = e.mac
			t["meta-data/local-ipv4"] = e.primary.String()
			t["meta-data/local-hostname"] = hostname(e.primary.String(), v.region)
			t["meta-data/hostname"] = t["meta-data/local-hostname"]
			t["meta-data/security-groups"] = strings.Join(e.groupNames, "\n")
		}
		base := "meta-data/network/interfaces/macs/" + e.mac + "/"
		t[base+"mac"] = e.mac
		t[base+"device-number"] = strconv.Itoa(e.device)
		t[base+"network-card"] = strconv.Itoa(e.card)
		t[base+"interface-id"] = e.id
		t[base+"owner-id"] = AccountID
		t[base+"local-hostname"] = hostname(e.primary.String(), v.region)
		t[base+"local-ipv4s"] = strings.Join(addrs, "\n")
		if len(e.prefixes) > 0 {
			t[base+"ipv4-prefix"] = strings.Join(prefixStrings(e.prefixes), "\n")
		}
		t[base+"subnet-id"] = e.subnetID
		t[base+"subnet-ipv4-cidr-block"] = e.subnetCIDR.String()
		t[base+"vpc-id"] = v.vpcID
		t[base+"vpc-ipv4-cidr-block"] = cidrs[0]
		t[base+"vpc-ipv4-cidr-blocks"] = strings.Join(cidrs, "\n")
		if e.subnetIPv6.IsValid() {
			t[base+"subnet-ipv6-cidr-blocks"] = e.subnetIPv6.String()
		}
		if v.vpcIPv6.IsValid() {
			t[base+"vpc-ipv6-cidr-blocks"] = v.vpcIPv6.String()
		}
		if len(e.ipv6) > 0 {
			v6 := make([]string, len(e.ipv6))
			for i, a := range e.ipv6 {
				v6[i] = a.String()
			}
			t[base+"ipv6s"] = strings.Join(v6, "\n")
			if e.primaryDevice {
				t["meta-data/ipv6"] = v6[0]
			}
		}
		if len(e.ipv6Prefixes) > 0 {
			t[base+"ipv6-prefix"] = strings.Join(prefixStrings(e.ipv6Prefixes), "\n")
		}
		t[base+"security-group-ids"] = strings.Join(e.groups, "\n")
		t[base+"security-groups"] = strings.Join(e.groupNames, "\n")
	}
	doc, _ := json.MarshalIndent(map[string]any{
		"accountId": AccountID, "architecture": "x86_64", "availabilityZone": v.az,
		"imageId": "ami-0123456789abcdef0", "instanceId": v.id, "instanceType": v.typ,
		"pendingTime": v.launched.UTC().Format(time.RFC3339), "privateIp": t["meta-data/local-ipv4"],
		"region": v.region, "version": "2017-09-30",
	}, "", "  ")
	t["dynamic/instance-identity/document"] = string(doc)
	return t
}

// hostname is EC2's private DNS name of an address: ip-a-b-c-d.<region>.compute.internal.
func hostname(addr, region string) string {
	return "ip-" + strings.ReplaceAll(addr, ".", "-") + "." + region + ".compute.internal"
}

// IMDSHandler serves IMDSv2 for the instances identify maps requests to:
// PUT /latest/api/token (header X-aws-ec2-metadata-token-ttl-seconds,
// 1..21600) returns a token; GET /latest/meta-data/... and
// /latest/dynamic/instance-identity/document need it in
// X-aws-ec2-metadata-token (401 without a valid one). Directories list their
// entries one per line, subdirectories with a trailing "/". Answers reflect
// the model as it was Faults.SetIMDSLag ago.
func (c *Cloud) IMDSHandler(identify func(r *http.Request) (instanceID string, ok bool)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := identify(r)
		if !ok {
			http.Error(w, "Not Found", http.StatusNotFound)
			return
		}
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
			c.imdsToken(w, r, id)
		case r.Method == http.MethodGet || r.Method == http.MethodHead:
			c.faults.count(IMDSOp)
			if code := c.faults.imdsFailure(); code != 0 {
				http.Error(w, http.StatusText(code), code)
				return
			}
			c.imdsGet(w, r, id)
		default:
			http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		}
	})
}

func (c *Cloud) imdsToken(w http.ResponseWriter, r *http.Request, instanceID string) {
	if r.Header.Get("X-Forwarded-For") != "" {
		http.Error(w, "Forbidden", http.StatusForbidden)
		return
	}
	ttl, err := strconv.Atoi(r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
	if err != nil || ttl < 1 || ttl > imdsMaxTTL {
		http.Error(w, "Bad Request", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	token := fmt.Sprintf("AQAEA%016x%016x%016x==", c.tokenRnd.Uint64(), c.tokenRnd.Uint64(), c.tokenRnd.Uint64())
	now := time.Now()
	for t, v := range c.imds.tokens {
		if now.After(v.expires) {
			delete(c.imds.tokens, t)
		}
	}
	c.imds.tokens[token] = imdsToken{instanceID: instanceID, expires: now.Add(time.Duration(ttl) * time.Second)}
	c.mu.Unlock()
	w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", strconv.Itoa(ttl))
	w.Header().Set("Content-Type", "text/plain")
	w.Write([]byte(token))
}

func (c *Cloud) imdsGet(w http.ResponseWriter, r *http.Request, instanceID string) {
	lag := c.faults.IMDSLag()
	c.mu.Lock()
	tok, ok := c.imds.tokens[r.Header.Get("X-aws-ec2-metadata-token")]
	valid := ok && tok.instanceID == instanceID && time.Now().Before(tok.expires)
	inst := c.instances[instanceID]
	view, known := c.imdsViewLocked(instanceID, lag)
	c.mu.Unlock()
	if !valid {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	if inst == nil || inst.state != "running" || !known {
		http.Error(w, "Not Found", http.StatusNotFound)
		return
	}
	path, ok := strings.CutPrefix(r.URL.Path, "/latest/")
	if !ok {
		http.Error(w, "Not Found", http.StatusNotFound)
		return
	}
	if body, ok := c.imdsIAM(instanceID, path); ok {
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte(body))
		return
	}
	tree := view.tree()
	c.faults.applyIMDSEdits(instanceID, tree)
	body, found := lookupIMDS(tree, path)
	if !found {
		http.Error(w, "Not Found", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	if strings.HasPrefix(path, "dynamic/instance-identity/document") {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Write([]byte(body))
}

// imdsViewLocked returns the instance's metadata as it was lag ago (the
// oldest known view when the instance is younger than that).
func (c *Cloud) imdsViewLocked(instanceID string, lag time.Duration) (imdsView, bool) {
	h := c.imds.history[instanceID]
	if len(h) == 0 {
		return imdsView{}, false
	}
	cut := time.Now().Add(-lag)
	i, _ := slices.BinarySearchFunc(h, cut, func(s imdsSnapshot, t time.Time) int {
		if s.at.After(t) {
			return 1
		}
		return -1
	})
	return h[max(i-1, 0)].view, true
}

// lookupIMDS answers a leaf's value or a directory's listing.
func lookupIMDS(tree map[string]string, path string) (string, bool) {
	path = strings.TrimSuffix(path, "/")
	if v, ok := tree[path]; ok {
		return v, true
	}
	dir := path + "/"
	if path == "" {
		dir = ""
	}
	var entries []string
	for k := range tree {
		rest, ok := strings.CutPrefix(k, dir)
		if !ok {
			continue
		}
		name, _, sub := strings.Cut(rest, "/")
		if sub {
			name += "/"
		}
		if !slices.Contains(entries, name) {
			entries = append(entries, name)
		}
	}
	if len(entries) == 0 {
		return "", false
	}
	slices.Sort(entries)
	return strings.Join(entries, "\n"), true
}
