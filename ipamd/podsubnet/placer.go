package podsubnet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// Modes of a Decision.
const (
	ModeCustom    = "custom-networking"
	ModeDiscovery = "subnet-discovery"
	ModeNode      = "node-subnet"
)

// ErrNoSubnet: subnet discovery found no eligible subnet (the node's subnet
// is tagged kubernetes.io/role/cni=0 and no other subnet of the zone is
// tagged for pods).
var ErrNoSubnet = errors.New("no subnet eligible for pod ENIs")

// Settings choose the mode.
type Settings struct {
	Custom    bool   // AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG
	Discovery bool   // ENABLE_SUBNET_DISCOVERY
	Cluster   string // this cluster's name, matched against kubernetes.io/cluster/<name> subnet tags
}

// Cloud is what a Placer asks of the provider.
type Cloud interface {
	Self(ctx context.Context) (provider.Instance, error)
	Subnets(ctx context.Context, q provider.SubnetQuery) ([]provider.Subnet, error)
}

// ENIConfigSource supplies the node's ENIConfig under custom networking (the
// Kubernetes part reads the Node and the ENIConfig objects).
type ENIConfigSource interface {
	// NodeENIConfig returns the ENIConfig the node selects now and where its
	// name came from (ConfigName), or an error wrapping ErrNoENIConfig. It
	// must not block on the API server.
	NodeENIConfig() (cfg ENIConfig, source string, err error)
}

// Target is one subnet a new ENI may go to, with its security groups.
type Target struct {
	SubnetID       string   `json:"subnetID"`
	SecurityGroups []string `json:"securityGroups"`
	Free           int      `json:"free"` // free addresses EC2 reported when the choice was made; -1 unknown
}

// Decision is where the next ENI goes and why: what the daemon logs and
// publishes in its AddressBudget status.
type Decision struct {
	At         time.Time   `json:"at"`
	Mode       string      `json:"mode"`                // ModeCustom, ModeDiscovery or ModeNode
	Targets    []Target    `json:"targets,omitempty"`   // in order of preference; a full one is skipped for the next
	ENIConfig  string      `json:"eniConfig,omitempty"` // custom networking: the node's ENIConfig
	Reason     string      `json:"reason"`              // one line: the choice and why, with free counts
	Candidates []Candidate `json:"-"`                   // discovery's judgement of each subnet of the zone
	Problem    string      `json:"problem,omitempty"`   // why no ENI can be placed now; "" when Targets is usable
	// Cause names the problem in CamelCase, as the node's Warning Event and
	// the AddressBudget condition do: ENIConfigNotFound, ENIConfigInvalid,
	// NoPodSubnet, PodSubnetsFull or ENIPlacementFailed.
	Cause string `json:"cause,omitempty"`
}

// Placer decides the subnet and security groups of each new ENI. It calls
// the cloud only from Place, once per new ENI (EC2 DescribeSubnets), and is
// safe for concurrent use.
type Placer struct {
	cloud Cloud
	set   Settings
	src   ENIConfigSource
	log   *slog.Logger
	// onProblem is called when a problem appears or changes (Event reason,
	// message, and the ENIConfig it concerns under custom networking, else
	// ""); nil: none.
	onProblem func(reason, message, eniConfig string)

	mu   sync.Mutex // guards the fields below
	self *provider.Instance
	last Decision
	// lastErr, lastInput and warned: a failed decision is reused while its
	// input is unchanged, for RetryAfter, so an ADD-driven retry loop
	// neither repeats EC2 calls nor floods the log.
	lastErr   error
	lastInput string
	warned    time.Time
}

// RetryAfter is how long a failed placement is answered from memory while
// its input (the node's ENIConfig, or the mode) is unchanged; a warning is
// logged again at most once per WarnEvery unless the problem changes.
const (
	RetryAfter = 5 * time.Second
	WarnEvery  = time.Minute
)

// NewPlacer wires a Placer; it does no I/O. src may be nil unless
// set.Custom; onProblem may be nil.
func NewPlacer(cloud Cloud, set Settings, src ENIConfigSource, log *slog.Logger, onProblem func(reason, message, eniConfig string)) *Placer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Placer{cloud: cloud, set: set, src: src, log: log, onProblem: onProblem}
}

// Last returns the latest decision (zero before the first Place).
func (p *Placer) Last() Decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.last
	d.Targets = slices.Clone(d.Targets)
	d.Candidates = slices.Clone(d.Candidates)
	return d
}

// Place decides where the next ENI goes, logs the decision and remembers it.
// Under custom networking a missing or invalid ENIConfig is an error
// wrapping ErrNoENIConfig or ErrInvalidENIConfig; under discovery no
// eligible subnet is ErrNoSubnet, every eligible one full provider.ErrSubnetFull.
func (p *Placer) Place(ctx context.Context) (Decision, error) {
	self, err := p.instance(ctx)
	if err != nil {
		return Decision{}, err
	}
	input := p.inputKey()
	if d, err, ok := p.recentFailure(input); ok {
		return d, err
	}
	var d Decision
	switch {
	case p.set.Custom:
		d, err = p.custom(ctx, self)
	case p.set.Discovery:
		d, err = p.discover(ctx, self)
	default:
		d = Decision{Mode: ModeNode, Targets: []Target{{SubnetID: self.SubnetID, SecurityGroups: self.SecurityGroups, Free: -1}},
			Reason: "subnet discovery and custom networking off: the node's subnet " + self.SubnetID}
	}
	d.At = time.Now()
	if err != nil {
		d.Problem, d.Cause = err.Error(), problemReason(err)
	}
	p.record(d, err, input)
	return d, err
}

// inputKey sums up what a decision depends on besides EC2: the node's
// ENIConfig under custom networking.
func (p *Placer) inputKey() string {
	if !p.set.Custom || p.src == nil {
		return ""
	}
	cfg, source, err := p.src.NodeENIConfig()
	return fmt.Sprint(cfg, source, err)
}

// recentFailure returns the last decision again when it failed less than
// RetryAfter ago on the same input.
func (p *Placer) recentFailure(input string) (Decision, error, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lastErr == nil || p.lastInput != input || time.Since(p.last.At) >= RetryAfter {
		return Decision{}, nil, false
	}
	return p.last, p.lastErr, true
}

func (p *Placer) instance(ctx context.Context) (provider.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.self != nil {
		return *p.self, nil
	}
	self, err := p.cloud.Self(ctx)
	if err != nil {
		return self, err
	}
	p.self = &self
	return self, nil
}

// custom places by the node's ENIConfig, checked against EC2's view of its subnet.
func (p *Placer) custom(ctx context.Context, self provider.Instance) (Decision, error) {
	d := Decision{Mode: ModeCustom}
	if p.src == nil {
		return d, fmt.Errorf("%w: the Kubernetes part is off (MY_NODE_NAME unset or no API server), so ENIConfigs cannot be read", ErrNoENIConfig)
	}
	cfg, source, err := p.src.NodeENIConfig()
	d.ENIConfig = cfg.Name
	if err != nil {
		return d, err
	}
	var sub provider.Subnet
	found := false
	if cfg.Subnet != "" {
		subs, err := p.cloud.Subnets(ctx, provider.SubnetQuery{IDs: []string{cfg.Subnet}})
		switch {
		case errors.Is(err, provider.ErrNotFound):
		case err != nil:
			return d, err
		case len(subs) == 1:
			sub, found = subs[0], true
		}
	}
	if err := CheckENIConfig(cfg, sub, found, self); err != nil {
		return d, err
	}
	groups, from := cfg.SecurityGroups, "its security groups"
	if len(groups) == 0 {
		groups, from = self.SecurityGroups, "no security groups in it: the primary ENI's"
	}
	d.Targets = []Target{{SubnetID: sub.ID, SecurityGroups: slices.Clone(groups), Free: sub.FreeAddresses}}
	d.Reason = fmt.Sprintf("ENIConfig %q (%s): subnet %s (%s, %d free), %s %s",
		cfg.Name, source, sub.ID, sub.CIDR, sub.FreeAddresses, from, strings.Join(groups, ","))
	return d, nil
}

// discover ranks the zone's subnets; every eligible one is a target, best first.
func (p *Placer) discover(ctx context.Context, self provider.Instance) (Decision, error) {
	d := Decision{Mode: ModeDiscovery}
	subs, err := p.cloud.Subnets(ctx, provider.SubnetQuery{Zone: self.AvailabilityZone})
	if err != nil {
		// As the reference does: without a listing, the node's own subnet.
		d.Targets = []Target{{SubnetID: self.SubnetID, SecurityGroups: slices.Clone(self.SecurityGroups), Free: -1}}
		d.Reason = "listing the zone's subnets failed (" + err.Error() + "): the node's subnet " + self.SubnetID
		return d, nil
	}
	d.Candidates = Rank(RankInput{NodeSubnet: self.SubnetID, Zone: self.AvailabilityZone, VPCID: self.VPCID,
		Cluster: p.set.Cluster, Subnets: subs})
	full := false
	var seen []string
	for _, c := range d.Candidates {
		seen = append(seen, c.String())
		if c.Eligible {
			d.Targets = append(d.Targets, Target{SubnetID: c.Subnet.ID, SecurityGroups: slices.Clone(self.SecurityGroups), Free: c.Subnet.FreeAddresses})
		}
		full = full || c.Why == "no free address"
	}
	all := strings.Join(seen, ", ")
	switch {
	case len(d.Targets) > 0:
		best := d.Candidates[0]
		d.Reason = "most free addresses: " + best.Subnet.ID + " (" + best.Why + ", " + strconv.Itoa(best.Subnet.FreeAddresses) + " free) of " + all
		return d, nil
	case full:
		return d, fmt.Errorf("%w: every eligible subnet of %s is full: %s", provider.ErrSubnetFull, self.AvailabilityZone, all)
	}
	return d, fmt.Errorf("%w in %s: %s", ErrNoSubnet, self.AvailabilityZone, all)
}

// record logs d and keeps it; a new or changed problem is also reported
// through onProblem.
func (p *Placer) record(d Decision, err error, input string) {
	p.mu.Lock()
	changed := d.Problem != "" && d.Problem != p.last.Problem
	warn := changed || time.Since(p.warned) >= WarnEvery
	if err != nil && warn {
		p.warned = time.Now()
	}
	p.last, p.lastErr, p.lastInput = d, err, input
	p.mu.Unlock()
	if err != nil {
		if warn {
			p.log.Warn("no ENI can be placed: the pool waits", "mode", d.Mode, "eniConfig", d.ENIConfig, "problem", d.Problem)
		}
		if changed && p.onProblem != nil {
			p.onProblem(d.Cause, d.Problem, d.ENIConfig)
		}
		return
	}
	p.log.Info("ENI placement", "mode", d.Mode, "subnet", d.Targets[0].SubnetID, "free", d.Targets[0].Free,
		"securityGroups", strings.Join(d.Targets[0].SecurityGroups, ","), "eniConfig", d.ENIConfig, "reason", d.Reason)
}

// problemReason is the Event reason of a placement error.
func problemReason(err error) string {
	switch {
	case errors.Is(err, ErrNoENIConfig):
		return "ENIConfigNotFound"
	case errors.Is(err, ErrInvalidENIConfig):
		return "ENIConfigInvalid"
	case errors.Is(err, ErrNoSubnet):
		return "NoPodSubnet"
	case errors.Is(err, provider.ErrSubnetFull):
		return "PodSubnetsFull"
	}
	return "ENIPlacementFailed"
}

// Refused records that a target refused the ENI (its subnet filled since
// the listing) and the next is tried.
func (p *Placer) refused(t Target, err error) {
	p.log.Warn("subnet refused the new ENI: trying the next", "subnet", t.SubnetID, "free", t.Free, "err", err)
}
