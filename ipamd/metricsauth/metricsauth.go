// Package metricsauth guards vpcipd's metrics listener as kube-rbac-proxy
// guards a metrics port, but inside the daemon: the listener speaks TLS only,
// and a request passes only with a bearer token that the API server
// authenticates (TokenReview, authentication.k8s.io/v1) and whose user may
// "get" the request's path as a non-resource URL (SubjectAccessReview,
// authorization.k8s.io/v1; the path is /metrics). A scraper is granted that
// by a ClusterRole such as
//
//	rules: [{nonResourceURLs: ["/metrics"], verbs: ["get"]}]
//
// bound to its ServiceAccount (charts/vpcip renders one when metrics.secure
// is on). Answers: 401 without a token or with one the API server does not
// authenticate, 403 when the user lacks the permission, 503 when the API
// server cannot be asked (never cached), else the wrapped handler's.
//
// Decisions are cached per token and path for TTL (default 1 min), at most
// MaxEntries of them (default 1024), keyed by the token's SHA-256 (the token
// itself is never kept), and concurrent misses of one key share one review:
// a scrape every 15 s costs two API calls a minute per scraper. A client
// sending a new bogus token with every request costs a TokenReview each,
// bounded by the rate limit of the client the daemon passes (cmd/vpcipd
// gives this package a client of its own, 5 requests/s, so the Kubernetes
// part's watches and writes never wait behind it).
//
// The certificate is the PEM pair tls.crt and tls.key of Options.TLSDir
// (re-read when either file changes, as a mounted Secret is updated), or,
// without one, a self-signed ECDSA P-256 certificate made in memory at New,
// valid for a year, for the names and addresses of Options.Hosts. A scraper
// then verifies nothing of the server (insecureSkipVerify), as with
// kube-rbac-proxy's own default; the token check is what keeps the numbers
// from other readers.
package metricsauth

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Options configure a Guard. Zero values take the defaults named.
type Options struct {
	// Client reaches the API server's TokenReview and SubjectAccessReview
	// APIs (its identity needs create on both: the chart's
	// files/metrics-auth-rules.yaml). Required.
	Client kubernetes.Interface
	// TLSDir holds tls.crt and tls.key; "" makes a self-signed certificate.
	TLSDir string
	// Hosts are the DNS names and IP addresses the self-signed certificate
	// names (the node's name and address); ignored with TLSDir.
	Hosts []string
	// TTL is how long a decision is reused; default 1 min.
	TTL time.Duration
	// MaxEntries bounds the decision cache; default 1024.
	MaxEntries int
	// ReviewTimeout bounds one TokenReview plus SubjectAccessReview; default 10 s.
	ReviewTimeout time.Duration
	Logger        *slog.Logger     // nil: discard
	Now           func() time.Time // nil: time.Now
}

// Guard authenticates and authorizes metrics requests (see the package
// comment). Use New, then TLSConfig for the listener and Wrap for its handler.
type Guard struct {
	o     Options
	certs certSource
	group singleflight.Group

	mu    sync.Mutex // guards cache
	cache map[[sha256.Size]byte]decision
}

// decision is one review's outcome for a token and path.
type decision struct {
	status  int    // http.StatusOK, StatusUnauthorized or StatusForbidden
	reason  string // why not allowed (shown to the client), or ""
	user    string // the authenticated user, or ""
	expires time.Time
}

// New makes a Guard: it loads or makes the certificate (an error names the
// file or says what failed) and does no API call.
func New(o Options) (*Guard, error) {
	if o.Client == nil {
		return nil, errors.New("metricsauth: Options.Client is required (the Kubernetes API reviews every scraper's token)")
	}
	if o.TTL <= 0 {
		o.TTL = time.Minute
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = 1024
	}
	if o.ReviewTimeout <= 0 {
		o.ReviewTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	var certs certSource
	var err error
	if o.TLSDir != "" {
		certs, err = newDirCert(o.TLSDir, o.Logger)
	} else {
		certs, err = newSelfSigned(o.Hosts, o.Now())
	}
	if err != nil {
		return nil, err
	}
	return &Guard{o: o, certs: certs, cache: map[[sha256.Size]byte]decision{}}, nil
}

// TLSConfig is the listener's TLS configuration: TLS 1.2 or later, HTTP/1.1.
func (g *Guard) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: g.certs.get, NextProtos: []string{"http/1.1"}}
}

// Wrap returns next behind the token check.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearer(r.Header.Get("Authorization"))
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="vpcipd metrics"`)
			http.Error(w, "Unauthorized: send a Kubernetes bearer token (Authorization: Bearer <token>) whose user may get "+r.URL.Path, http.StatusUnauthorized)
			return
		}
		d, err := g.decide(r.Context(), token, r.URL.Path)
		if err != nil {
			g.o.Logger.Warn("metrics: cannot review a scraper's token", "err", err)
			http.Error(w, "Service Unavailable: the API server could not review the token: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		switch d.status {
		case http.StatusOK:
			next.ServeHTTP(w, r)
		case http.StatusUnauthorized:
			w.Header().Set("WWW-Authenticate", `Bearer realm="vpcipd metrics", error="invalid_token"`)
			http.Error(w, "Unauthorized: "+d.reason, d.status)
		default:
			http.Error(w, "Forbidden: "+d.reason, d.status)
		}
	})
}

// bearer is the token of an "Authorization: Bearer <token>" header.
func bearer(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	return token, true
}

// decide returns the cached decision for token and path, or reviews it.
func (g *Guard) decide(ctx context.Context, token, path string) (decision, error) {
	key := sha256.Sum256([]byte(path + "\x00" + token))
	now := g.o.Now()
	g.mu.Lock()
	d, ok := g.cache[key]
	g.mu.Unlock()
	if ok && now.Before(d.expires) {
		return d, nil
	}
	v, err, _ := g.group.Do(string(key[:]), func() (any, error) {
		// Detached from one request's context: others may wait on this review.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.o.ReviewTimeout)
		defer cancel()
		d, err := g.review(rctx, token, path)
		if err != nil {
			return decision{}, err
		}
		d.expires = g.o.Now().Add(g.o.TTL)
		g.store(key, d)
		return d, nil
	})
	if err != nil {
		return decision{}, err
	}
	return v.(decision), nil
}

// store keeps d, first dropping expired entries and then, if still full,
// arbitrary ones (map order): the cache never holds more than MaxEntries.
func (g *Guard) store(key [sha256.Size]byte, d decision) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.cache) >= g.o.MaxEntries {
		now := g.o.Now()
		for k, e := range g.cache {
			if !now.Before(e.expires) {
				delete(g.cache, k)
			}
		}
		for k := range g.cache {
			if len(g.cache) < g.o.MaxEntries {
				break
			}
			delete(g.cache, k)
		}
	}
	g.cache[key] = d
}

// review asks the API server who the token is (TokenReview) and whether
// that user may get path (SubjectAccessReview, non-resource attributes).
func (g *Guard) review(ctx context.Context, token, path string) (decision, error) {
	tr, err := g.o.Client.AuthenticationV1().TokenReviews().Create(ctx,
		&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return decision{}, fmt.Errorf("TokenReview: %w", err)
	}
	if !tr.Status.Authenticated {
		reason := "the API server does not accept the token"
		if tr.Status.Error != "" {
			reason += ": " + tr.Status.Error
		}
		return decision{status: http.StatusUnauthorized, reason: reason}, nil
	}
	u := tr.Status.User
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := g.o.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: "get"},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return decision{}, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	if !sar.Status.Allowed || sar.Status.Denied {
		g.o.Logger.Debug("metrics: scraper not allowed", "user", u.Username, "path", path, "reason", sar.Status.Reason)
		reason := fmt.Sprintf("user %q may not get %s (grant get on the nonResourceURL %s)", u.Username, path, path)
		return decision{status: http.StatusForbidden, reason: reason, user: u.Username}, nil
	}
	return decision{status: http.StatusOK, user: u.Username}, nil
}

// CachedDecisions is how many decisions the cache holds now.
func (g *Guard) CachedDecisions() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.cache)
}
