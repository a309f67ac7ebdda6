package vpcsim

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// IAM is the account's identity setup: which roles exist, whom each trusts
// and which EC2 actions each may call. Until SetIAM is called vpcsim accepts
// any signature or none, as before; after, every EC2 request must be signed
// (SigV4) with credentials vpcsim issued, for a role that allows its action.
type IAM struct {
	// Providers are the account's OIDC identity providers (IAM's "Identity
	// providers"), which AssumeRoleWithWebIdentity accepts tokens from.
	Providers []OIDCProvider
	// Roles are the roles there are.
	Roles []Role
	// InstanceRole is the ARN of the role of every instance's instance
	// profile (one of Roles): IMDS serves its credentials under
	// meta-data/iam/security-credentials/<role name>. "": instances have no
	// instance profile and IMDS has no iam/ directory.
	InstanceRole string
}

// OIDCProvider is an OpenID Connect issuer whose ID tokens (a Kubernetes
// API server's projected ServiceAccount tokens) can be traded for a role's
// credentials.
type OIDCProvider struct {
	// Issuer is the tokens' `iss`, e.g. the API server's
	// --service-account-issuer (https://kubernetes.default.svc).
	Issuer string
	// Audiences are the accepted `aud` values (IAM's client IDs); empty:
	// sts.amazonaws.com, what EKS's pod identity webhook asks for.
	Audiences []string
	// JWKS returns the issuer's signing keys as a JSON Web Key Set, what
	// the issuer serves at its jwks_uri (/openid/v1/jwks on a Kubernetes
	// API server). It is called for each token, so rotated keys are seen.
	JWKS func() ([]byte, error)
}

// Role is an IAM role.
type Role struct {
	// ARN is arn:aws:iam::<account>:role/<name>.
	ARN string
	// TrustIssuer and TrustSubjects are the role's trust policy for web
	// identities: tokens of that OIDC provider whose `sub` is one of
	// TrustSubjects (e.g. system:serviceaccount:kube-system:aws-node) may
	// assume it. An empty TrustIssuer: no web identity may.
	TrustIssuer   string
	TrustSubjects []string
	// Actions are the EC2 actions the role's policies allow, as IAM names
	// them ("ec2:CreateNetworkInterface"); "ec2:*" allows every action.
	Actions []string
}

// AmazonEKSCNIPolicyActions are the EC2 actions of AWS's managed policy
// AmazonEKS_CNI_Policy (the policy aws-node's role carries), as AWS's
// managed policy reference lists its version v5 (March 2024); CreateTags is
// allowed there on network interfaces only, vpcsim does not look at
// resources.
var AmazonEKSCNIPolicyActions = []string{
	"ec2:AssignPrivateIpAddresses", "ec2:AttachNetworkInterface", "ec2:CreateNetworkInterface",
	"ec2:DeleteNetworkInterface", "ec2:DescribeInstances", "ec2:DescribeTags",
	"ec2:DescribeNetworkInterfaces", "ec2:DescribeInstanceTypes", "ec2:DescribeSubnets",
	"ec2:DetachNetworkInterface", "ec2:ModifyNetworkInterfaceAttribute", "ec2:UnassignPrivateIpAddresses",
	"ec2:CreateTags",
}

// Name is the role's name, the last element of its ARN.
func (r Role) Name() string { return r.ARN[strings.LastIndexByte(r.ARN, '/')+1:] }

func (r Role) allows(action string) bool {
	return slices.Contains(r.Actions, "ec2:"+action) || slices.Contains(r.Actions, "ec2:*")
}

// Sessions issued by STS and the instance profile last this long (STS's
// default DurationSeconds, 1 hour).
const sessionLifetime = time.Hour

// iamState is the IAM setup and the temporary credentials issued from it.
type iamState struct {
	mu       sync.Mutex // guards the fields below
	cfg      *IAM       // nil: no authentication
	roles    map[string]Role
	sessions map[string]session        // by access key id
	profiles map[string]session        // instance profile sessions by instance id
	calls    map[string]map[string]int // principal ARN -> "Action" or "Action:ErrorCode" -> count
	n        uint64                    // issued sessions, for unique keys
}

// session is one set of temporary credentials.
type session struct {
	role               Role
	principal          string // arn:aws:sts::<account>:assumed-role/<role>/<session>
	key, secret, token string
	expires            time.Time
}

// SetIAM turns authentication and authorization on with cfg (see IAM). It
// returns an error for an InstanceRole or TrustIssuer that names nothing.
func (c *Cloud) SetIAM(cfg IAM) error {
	roles := map[string]Role{}
	for _, r := range cfg.Roles {
		roles[r.ARN] = r
	}
	if _, ok := roles[cfg.InstanceRole]; cfg.InstanceRole != "" && !ok {
		return fmt.Errorf("vpcsim: instance role %s is not one of the roles", cfg.InstanceRole)
	}
	for _, r := range cfg.Roles {
		if r.TrustIssuer != "" && !slices.ContainsFunc(cfg.Providers, func(p OIDCProvider) bool { return p.Issuer == r.TrustIssuer }) {
			return fmt.Errorf("vpcsim: role %s trusts %s, which is not an OIDC provider", r.ARN, r.TrustIssuer)
		}
	}
	s := &c.iam
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg, s.roles = &cfg, roles
	s.sessions, s.profiles, s.calls = map[string]session{}, map[string]session{}, map[string]map[string]int{}
	return nil
}

// EC2Calls returns, for each principal that made EC2 requests since SetIAM
// (an assumed role's session ARN, arn:aws:sts::...:assumed-role/<role>/<session>),
// how many of each action it made: "CreateNetworkInterface" counts the
// answered ones, "CreateNetworkInterface:UnauthorizedOperation" the ones
// refused for want of permission.
func (c *Cloud) EC2Calls() map[string]map[string]int {
	s := &c.iam
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]int{}
	for p, m := range s.calls {
		out[p] = map[string]int{}
		for k, v := range m {
			out[p][k] = v
		}
	}
	return out
}

func (s *iamState) on() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg != nil
}

// newSessionLocked issues credentials for role, named sessionName.
func (s *iamState) newSessionLocked(c *Cloud, role Role, sessionName string, now time.Time) session {
	s.n++
	c.mu.Lock()
	a, b, d := c.tokenRnd.Uint64(), c.tokenRnd.Uint64(), c.tokenRnd.Uint64()
	c.mu.Unlock()
	ses := session{
		role:      role,
		principal: fmt.Sprintf("arn:aws:sts::%s:assumed-role/%s/%s", AccountID, role.Name(), sessionName),
		key:       fmt.Sprintf("ASIA%04X%012X", s.n&0xffff, a&0xffffffffffff),
		secret:    fmt.Sprintf("%016x%016x%08x", b, d, uint32(a>>32)),
		token:     fmt.Sprintf("IQoJvpcsim%016x%016x%016x", a, b, d),
		expires:   now.Add(sessionLifetime).Truncate(time.Second),
	}
	s.sessions[ses.key] = ses
	return ses
}

// authenticate checks r's SigV4 signature (Authorization header) against
// the credentials vpcsim issued, over body, and returns the session it was
// signed with: AuthFailure (401) for a missing, unknown or wrong signature,
// RequestExpired for credentials past their expiry.
func (s *iamState) authenticate(r *http.Request, body []byte) (session, *Error) {
	auth := r.Header.Get("Authorization")
	rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 ")
	if !ok {
		return session{}, errorf("AuthFailure", "AWS was not able to validate the provided access credentials")
	}
	var cred, signed, sig string
	for _, kv := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		switch k {
		case "Credential":
			cred = v
		case "SignedHeaders":
			signed = v
		case "Signature":
			sig = v
		}
	}
	scope := strings.Split(cred, "/") // key/date/region/service/aws4_request
	if len(scope) != 5 || signed == "" || sig == "" {
		return session{}, errorf("AuthFailure", "AWS was not able to validate the provided access credentials")
	}
	s.mu.Lock()
	ses, known := s.sessions[scope[0]]
	s.mu.Unlock()
	if !known {
		return session{}, errorf("AuthFailure", "AWS was not able to validate the provided access credentials")
	}
	if r.Header.Get("X-Amz-Security-Token") != ses.token {
		return session{}, errorf("AuthFailure", "AWS was not able to validate the provided access credentials")
	}
	if !hmac.Equal([]byte(sig), []byte(sigV4(r, body, ses.secret, scope, strings.Split(signed, ";")))) {
		return session{}, errorf("AuthFailure", "AWS was not able to validate the provided access credentials")
	}
	if time.Now().After(ses.expires) {
		return session{}, errorf("RequestExpired", "Request has expired.")
	}
	return ses, nil
}

// sigV4 computes the signature of r (AWS Signature Version 4, "Create a
// signed AWS API request" in the IAM user guide) over the headers the client
// signed.
func sigV4(r *http.Request, body []byte, secret string, scope, signedHeaders []string) string {
	var canon strings.Builder
	canon.WriteString(r.Method + "\n")
	path := r.URL.EscapedPath()
	if path == "" {
		path = "/"
	}
	canon.WriteString(path + "\n")
	q := r.URL.Query()
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var qs []string
	for _, k := range keys {
		vs := slices.Clone(q[k])
		sort.Strings(vs)
		for _, v := range vs {
			qs = append(qs, uriEncode(k)+"="+uriEncode(v))
		}
	}
	canon.WriteString(strings.Join(qs, "&") + "\n")
	for _, h := range signedHeaders {
		var v string
		switch h {
		case "host":
			v = r.Host
		case "content-length":
			v = strconv.FormatInt(r.ContentLength, 10)
		default:
			vals := r.Header.Values(h)
			for i := range vals {
				vals[i] = strings.Join(strings.Fields(vals[i]), " ")
			}
			v = strings.Join(vals, ",")
		}
		canon.WriteString(h + ":" + v + "\n")
	}
	canon.WriteString("\n" + strings.Join(signedHeaders, ";") + "\n")
	sum := sha256.Sum256(body)
	canon.WriteString(hex.EncodeToString(sum[:]))
	creq := sha256.Sum256([]byte(canon.String()))
	toSign := "AWS4-HMAC-SHA256\n" + r.Header.Get("X-Amz-Date") + "\n" + strings.Join(scope[1:], "/") + "\n" + hex.EncodeToString(creq[:])
	k := []byte("AWS4" + secret)
	for _, part := range scope[1:] {
		k = hmacSHA256(k, part)
	}
	return hex.EncodeToString(hmacSHA256(k, toSign))
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

// uriEncode is SigV4's URI encoding: every byte but A-Z a-z 0-9 - _ . ~
// percent-encoded.
func uriEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch >= 'A' && ch <= 'Z' || ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || strings.IndexByte("-_.~", ch) >= 0 {
			b.WriteByte(ch)
		} else {
			fmt.Fprintf(&b, "%%%02X", ch)
		}
	}
	return b.String()
}

// readBody reads r's body (already size-bounded) and puts it back for
// ParseForm.
func readBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
}

// authorize refuses an action the session's role does not allow, as EC2
// does (UnauthorizedOperation, 403), and counts the call for EC2Calls.
func (s *iamState) authorize(ses session, action string) *Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.calls[ses.principal]
	if m == nil {
		m = map[string]int{}
		s.calls[ses.principal] = m
	}
	if !ses.role.allows(action) {
		m[action+":UnauthorizedOperation"]++
		return errorf("UnauthorizedOperation", "You are not authorized to perform this operation. User: %s is not authorized to perform: ec2:%s because no identity-based policy allows the ec2:%s action", ses.principal, action, action)
	}
	m[action]++
	return nil
}

// checkEC2Auth is the EC2 handler's authentication and authorization of
// one request for action (nil while IAM is off).
func (c *Cloud) checkEC2Auth(r *http.Request, body []byte, action string) *Error {
	if !c.iam.on() {
		return nil
	}
	ses, err := c.iam.authenticate(r, body)
	if err != nil {
		return err
	}
	return c.iam.authorize(ses, action)
}

// imdsIAM answers IMDS's iam/ paths for instanceID: the instance profile
// role's name under meta-data/iam/security-credentials/, and its current
// credentials (renewed when less than 15 minutes remain, as EC2 rotates them
// well before expiry) as the JSON document the SDKs read. ok is false for
// other paths, or when there is no instance profile.
func (c *Cloud) imdsIAM(instanceID, path string) (body string, ok bool) {
	s := &c.iam
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg == nil || s.cfg.InstanceRole == "" {
		return "", false
	}
	role := s.roles[s.cfg.InstanceRole]
	switch strings.TrimSuffix(path, "/") {
	case "meta-data/iam":
		return "info\nsecurity-credentials/", true
	case "meta-data/iam/info":
		b, _ := json.Marshal(map[string]string{"Code": "Success", "InstanceProfileArn": strings.Replace(role.ARN, ":role/", ":instance-profile/", 1), "InstanceProfileId": "AIPAVPCSIM"})
		return string(b), true
	case "meta-data/iam/security-credentials":
		return role.Name(), true
	case "meta-data/iam/security-credentials/" + role.Name():
		now := time.Now()
		ses, have := s.profiles[instanceID]
		if !have || ses.expires.Sub(now) < 15*time.Minute {
			ses = s.newSessionLocked(c, role, instanceID, now)
			s.profiles[instanceID] = ses
		}
		b, _ := json.Marshal(map[string]string{"Code": "Success", "LastUpdated": now.UTC().Format(time.RFC3339),
			"Type": "AWS-HMAC", "AccessKeyId": ses.key, "SecretAccessKey": ses.secret, "Token": ses.token,
			"Expiration": ses.expires.UTC().Format(time.RFC3339)})
		return string(b), true
	}
	return "", false
}
