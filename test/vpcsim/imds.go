package vpcsim

import (
	"encoding/json"
	"fmt"
	"net/http"
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
	tree map[string]string // "meta-data/instance-id" → value
}

// recordIMDSLocked remembers the instance's metadata as it is now; IMDS
// serves it once the configured lag has passed.
func (c *Cloud) recordIMDSLocked(inst *instance) {
	if inst == nil {
		return
	}
	h := append(c.imds.history[inst.id], imdsSnapshot{at: time.Now(), tree: c.imdsTreeLocked(inst)})
	if len(h) > imdsHistoryLen {
		h = slices.Delete(h, 0, len(h)-imdsHistoryLen)
	}
	c.imds.history[inst.id] = h
}

// imdsTreeLocked builds every metadata leaf of an instance.
func (c *Cloud) imdsTreeLocked(inst *instance) map[string]string {
	t := map[string]string{
		"meta-data/instance-id":                 inst.id,
		"meta-data/instance-type":               inst.typ,
		"meta-data/ami-id":                      "ami-0123456789abcdef0",
		"meta-data/placement/availability-zone": inst.az,
		"meta-data/placement/region":            c.cfg.Region,
		"meta-data/services/domain":             "amazonaws.com",
	}
	var cidrs []string
	for _, p := range c.vpc.cidrs {
		cidrs = append(cidrs, p.String())
	}
	for _, e := range inst.enis {
		if e.attachStatus != "attached" {
			continue
		}
		s := c.subnets[e.subnetID]
		if e.deviceIndex == 0 && e.networkCard == inst.itype.DefaultNetworkCard {
			t["meta-data/mac"] = e.mac
			t["meta-data/local-ipv4"] = e.primary.String()
			t["meta-data/local-hostname"] = hostname(e.primary.String(), c.cfg.Region)
			t["meta-data/hostname"] = t["meta-data/local-hostname"]
			var names []string
			for _, g := range e.groups {
				names = append(names, c.groups[g].name)
			}
			t["meta-data/security-groups"] = strings.Join(names, "\n")
		}
		base := "meta-data/network/interfaces/macs/" + e.mac + "/"
		t[base+"mac"] = e.mac
		t[base+"device-number"] = strconv.Itoa(e.deviceIndex)
		t[base+"network-card"] = strconv.Itoa(e.networkCard)
		t[base+"interface-id"] = e.id
		t[base+"owner-id"] = AccountID
		t[base+"local-hostname"] = hostname(e.primary.String(), c.cfg.Region)
		t[base+"local-ipv4s"] = strings.Join(addrsOf(e), "\n")
		if len(e.prefixes) > 0 {
			t[base+"ipv4-prefix"] = strings.Join(prefixStrings(e.prefixes), "\n")
		}
		t[base+"subnet-id"] = s.id
		t[base+"subnet-ipv4-cidr-block"] = s.cidr.String()
		t[base+"vpc-id"] = c.vpc.id
		t[base+"vpc-ipv4-cidr-block"] = c.vpc.cidrs[0].String()
		t[base+"vpc-ipv4-cidr-blocks"] = strings.Join(cidrs, "\n")
		t[base+"security-group-ids"] = strings.Join(e.groups, "\n")
	}
	doc, _ := json.MarshalIndent(map[string]any{
		"accountId": AccountID, "architecture": "x86_64", "availabilityZone": inst.az,
		"imageId": "ami-0123456789abcdef0", "instanceId": inst.id, "instanceType": inst.typ,
		"pendingTime": inst.launched.UTC().Format(time.RFC3339), "privateIp": t["meta-data/local-ipv4"],
		"region": c.cfg.Region, "version": "2017-09-30",
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
	token := fmt.Sprintf("AQAEA%016x%016x%016x==", c.rnd.Uint64(), c.rnd.Uint64(), c.rnd.Uint64())
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
	tree := c.imdsViewLocked(instanceID, lag)
	c.mu.Unlock()
	if !valid {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	if inst == nil || inst.state != "running" || tree == nil {
		http.Error(w, "Not Found", http.StatusNotFound)
		return
	}
	path, ok := strings.CutPrefix(r.URL.Path, "/latest/")
	if !ok {
		http.Error(w, "Not Found", http.StatusNotFound)
		return
	}
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
func (c *Cloud) imdsViewLocked(instanceID string, lag time.Duration) map[string]string {
	h := c.imds.history[instanceID]
	if len(h) == 0 {
		return nil
	}
	cut := time.Now().Add(-lag)
	i, _ := slices.BinarySearchFunc(h, cut, func(s imdsSnapshot, t time.Time) int {
		if s.at.After(t) {
			return 1
		}
		return -1
	})
	return h[max(i-1, 0)].tree
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
