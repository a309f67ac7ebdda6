package awsprovider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"golang.org/x/time/rate"

	"github.com/vpcip/vpcip/provider"
)

// Tag keys put on every ENI the client creates.
const (
	TagInstanceID = "vpcip.io/instance-id" // the instance the ENI was created for
	TagCluster    = "vpcip.io/cluster"     // Options.ClusterName
	TagNode       = "vpcip.io/node"        // Options.NodeName
	TagCreatedAt  = "vpcip.io/created-at"  // creation time, RFC 3339, UTC
)

// Options configure a Client. The zero value of every field picks the
// documented default; only ClusterName is required.
type Options struct {
	// ClusterName is written to TagCluster on created ENIs and selects the
	// ENIs DeleteLeakedENIs may delete. Required.
	ClusterName string
	// NodeName is written to TagNode on created ENIs (the Kubernetes node name).
	NodeName string

	// MutatingRate and MutatingBurst bound the EC2 calls that change state
	// (Create/Attach/Detach/Delete/ModifyNetworkInterface…,
	// Assign/UnassignPrivateIpAddresses), retries included, in calls per
	// second and calls. Defaults 2 and 5.
	MutatingRate  float64
	MutatingBurst int
	// DescribeRate and DescribeBurst bound the EC2 describe calls, retries
	// and every page included, in calls per second and calls. Defaults 5 and 10.
	DescribeRate  float64
	DescribeBurst int

	// RetryBase and RetryMax shape the backoff after a throttled or transient
	// failure: attempt n waits d/2 + rand[0, d/2) with d = min(RetryMax,
	// RetryBase·2^(n-1)). Defaults 200ms and 10s.
	RetryBase time.Duration
	RetryMax  time.Duration
	// MaxAttempts is how many transient failures other than throttling
	// (HTTP 5xx, broken connection) a repeatable call may meet before it
	// gives up; throttled attempts do not count. Default 3.
	MaxAttempts int
	// AttemptTimeout bounds one attempt of an EC2 call: its request and
	// the whole response. An attempt without an answer by then is
	// cancelled, logged as a warning, and counts as a transient failure:
	// retried (up to MaxAttempts) for an action safe to repeat, returned for
	// the others (an assign or attach whose effect is unknown; the caller's
	// reconcile reads what EC2 holds). Without it a request EC2, a proxy or
	// the network leaves unanswered would hold the pool, or a restarting
	// daemon's restore, for as long as the connection lives. Default 30s
	// (EC2 answers in well under a second; a 1,000-ENI describe page in a
	// few).
	AttemptTimeout time.Duration
	// MaxThrottleWait bounds how long one call keeps retrying while EC2
	// refuses it for rate; after that it fails with provider.ErrThrottled.
	// The context's deadline also ends it. Default 2 minutes.
	MaxThrottleWait time.Duration

	// MetadataWait bounds the wait, after an attach or an assign, for IMDS to
	// show the change; MetadataPoll is the first poll interval (doubling up
	// to 1s). Defaults 30s and 100ms.
	MetadataWait time.Duration
	MetadataPoll time.Duration
	// DetachWait bounds the wait, in DeleteENI, for a detached ENI to become
	// available; polls start at DetachPoll and double up to 2s.
	// Defaults 60s and 250ms.
	DetachWait time.Duration
	DetachPoll time.Duration

	// PageSize is MaxResults for paginated describes (EC2 allows 5 to 1000).
	// Default 1000.
	PageSize int32

	// LeakTagKeys are extra tag keys that mark an ENI as this cluster's when
	// their value equals ClusterName (for example the tag an earlier plugin
	// put on its ENIs). TagCluster is always used.
	LeakTagKeys []string

	// Budget, if set, is the fleet's shared EC2 request budget (package
	// ipamd/ec2budget): every attempt of a mutating action also takes one
	// request from it, after the local MutatingRate pacing, at the priority
	// the call's context carries (provider.WithPriority; default
	// PriorityRelease for unassign, detach and delete, else PriorityRefill),
	// and every RequestLimitExceeded is reported to it. nil: local pacing
	// only.
	Budget provider.RequestBudget

	// Observe, if set, receives one report per cloud call; see
	// provider.CallObserver. A call EC2 refuses for rate and that is retried
	// is reported once as "throttled" with that attempt's latency, and the
	// call's final outcome is reported with the latency of all attempts.
	Observe provider.CallObserver
	// Logger receives debug records of retries and rollbacks, and warnings of
	// failed clean-ups. Default: discard.
	Logger *slog.Logger

	// AWSConfig replaces config.LoadDefaultConfig when set (tests, or a
	// caller that loaded the configuration itself).
	AWSConfig *aws.Config
	// EC2Options and IMDSOptions are applied after the client's own settings
	// when the SDK clients are built.
	EC2Options  []func(*ec2.Options)
	IMDSOptions []func(*imds.Options)
}

func (o *Options) setDefaults() error {
	if o.ClusterName == "" {
		return errors.New("awsprovider: Options.ClusterName is required")
	}
	setIfZero(&o.MutatingRate, 2)
	setIfZero(&o.MutatingBurst, 5)
	setIfZero(&o.DescribeRate, 5)
	setIfZero(&o.DescribeBurst, 10)
	setIfZero(&o.RetryBase, 200*time.Millisecond)
	setIfZero(&o.RetryMax, 10*time.Second)
	setIfZero(&o.MaxAttempts, 3)
	setIfZero(&o.MaxThrottleWait, 2*time.Minute)
	setIfZero(&o.AttemptTimeout, 30*time.Second)
	setIfZero(&o.MetadataWait, 30*time.Second)
	setIfZero(&o.MetadataPoll, 100*time.Millisecond)
	setIfZero(&o.DetachWait, 60*time.Second)
	setIfZero(&o.DetachPoll, 250*time.Millisecond)
	setIfZero(&o.PageSize, 1000)
	if o.PageSize < 5 || o.PageSize > 1000 {
		return fmt.Errorf("awsprovider: Options.PageSize %d is outside EC2's 5..1000", o.PageSize)
	}
	if o.MutatingRate < 0 || o.DescribeRate < 0 || o.MutatingBurst < 1 || o.DescribeBurst < 1 {
		return errors.New("awsprovider: rates must be positive and bursts at least 1")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Observe == nil {
		o.Observe = func(string, string, time.Duration) {}
	}
	return nil
}

func setIfZero[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// Client is a provider.Provider on EC2 and IMDSv2. It is safe for concurrent
// use.
type Client struct {
	ec2      *ec2.Client
	imds     *imds.Client
	opts     Options
	mutating *rate.Limiter
	describe *rate.Limiter
	log      *slog.Logger
	table    map[string]provider.Limits // built-in limits (limitsTable)

	createMu sync.Mutex // serializes CreateENI, which picks the next free device number
	tickets  tickets    // places held in the fleet's shared budget for deferred calls

	selfMu sync.Mutex     // guards self
	self   *identity      // this instance, read once from IMDS
	meta   metadataLedger // EC2's word on addresses, for MetadataENIs

	cacheMu  sync.Mutex                 // guards the fields below
	limits   map[string]provider.Limits // instance type → limits, from DescribeInstanceTypes
	subnets  map[string]netip.Prefix    // subnet id → IPv4 CIDR; subnet CIDRs never change
	leakSeen map[string]time.Time       // ENI id → first time seen leaked without a creation tag
}

var _ provider.Provider = (*Client)(nil)

// New builds a Client from opts. Unless opts.AWSConfig is set it loads the
// SDK's default configuration (environment, shared files, credential chain),
// which reads local files but makes no network call; the instance's identity
// is read from IMDS on first use. It returns an error if the configuration
// cannot be loaded or opts are invalid.
func New(ctx context.Context, opts Options) (*Client, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	var cfg aws.Config
	if opts.AWSConfig != nil {
		cfg = opts.AWSConfig.Copy()
	} else {
		var err error
		if cfg, err = config.LoadDefaultConfig(ctx); err != nil {
			return nil, fmt.Errorf("awsprovider: loading AWS configuration: %w", err)
		}
	}
	ec2Opts := append([]func(*ec2.Options){func(o *ec2.Options) {
		o.Retryer = aws.NopRetryer{} // the client paces and retries itself; see the package doc
	}}, opts.EC2Options...)
	c := &Client{
		ec2:      ec2.NewFromConfig(cfg, ec2Opts...),
		imds:     imds.NewFromConfig(cfg, opts.IMDSOptions...),
		opts:     opts,
		mutating: rate.NewLimiter(rate.Limit(opts.MutatingRate), opts.MutatingBurst),
		describe: rate.NewLimiter(rate.Limit(opts.DescribeRate), opts.DescribeBurst),
		log:      opts.Logger,
		table:    limitsTable,
		limits:   map[string]provider.Limits{},
		subnets:  map[string]netip.Prefix{},
		leakSeen: map[string]time.Time{},
	}
	c.meta.init()
	return c, nil
}
