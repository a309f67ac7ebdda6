package vpcsim

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"encoding/xml"
	"math/big"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// STS's Query API version and XML namespace.
const (
	stsVersion   = "2011-06-15"
	stsNamespace = "https://sts.amazonaws.com/doc/2011-06-15/"
)

// defaultAudience is the audience EKS's pod identity webhook puts in the
// projected token, and the client ID an EKS cluster's OIDC provider has.
const defaultAudience = "sts.amazonaws.com"

// isSTS reports whether a parsed Query request is for STS (the EC2 handler
// serves both, so AWS_ENDPOINT_URL_STS can name the EC2 endpoint).
func isSTS(form url.Values) bool {
	return form.Get("Version") == stsVersion || form.Get("Action") == "AssumeRoleWithWebIdentity"
}

// serveSTS answers STS's AssumeRoleWithWebIdentity (the call aws-sdk-go-v2's
// web identity provider makes, unsigned, with AWS_ROLE_ARN and the token of
// AWS_WEB_IDENTITY_TOKEN_FILE): it verifies the token (signature against the
// issuer's keys, expiry, audience) and the role's trust in the token's
// issuer and subject, and returns an hour's credentials for the role.
// Errors are STS's: InvalidIdentityToken (400) for a token that does not
// verify, ExpiredTokenException (400), AccessDenied (403) when the role does
// not trust the token, and InvalidAction without IAM set up.
func (c *Cloud) serveSTS(w http.ResponseWriter, r *http.Request, requestID string) {
	w.Header().Set("X-Amzn-Requestid", requestID) // where the SDK reads an STS error's request id
	res, err := c.assumeRoleWithWebIdentity(r.Form)
	if err != nil {
		body, _ := xml.Marshal(stsErrorResponse{Error: stsError{Type: "Sender", Code: err.Code, Message: err.Message}, RequestID: requestID})
		writeBody(w, r, stsStatus(err.Code), append([]byte(xml.Header), body...))
		return
	}
	res.Metadata.RequestID = requestID
	body, _ := xml.Marshal(res)
	writeBody(w, r, http.StatusOK, append([]byte(xml.Header), body...))
}

func stsStatus(code string) int {
	if code == "AccessDenied" {
		return http.StatusForbidden
	}
	return http.StatusBadRequest
}

type stsErrorResponse struct {
	XMLName   xml.Name `xml:"https://sts.amazonaws.com/doc/2011-06-15/ ErrorResponse"`
	Error     stsError `xml:"Error"`
	RequestID string   `xml:"RequestId"`
}

type stsError struct {
	Type    string `xml:"Type"`
	Code    string `xml:"Code"`
	Message string `xml:"Message"`
}

type assumeRoleResponse struct {
	XMLName xml.Name `xml:"https://sts.amazonaws.com/doc/2011-06-15/ AssumeRoleWithWebIdentityResponse"`
	Result  struct {
		Subject     string `xml:"SubjectFromWebIdentityToken"`
		Audience    string `xml:"Audience"`
		Provider    string `xml:"Provider"`
		AssumedRole struct {
			Arn string `xml:"Arn"`
			ID  string `xml:"AssumedRoleId"`
		} `xml:"AssumedRoleUser"`
		Credentials struct {
			AccessKeyID     string `xml:"AccessKeyId"`
			SecretAccessKey string `xml:"SecretAccessKey"`
			SessionToken    string `xml:"SessionToken"`
			Expiration      string `xml:"Expiration"`
		} `xml:"Credentials"`
	} `xml:"AssumeRoleWithWebIdentityResult"`
	Metadata struct {
		RequestID string `xml:"RequestId"`
	} `xml:"ResponseMetadata"`
}

// jwtClaims are the claims of a Kubernetes projected ServiceAccount token
// that STS checks.
type jwtClaims struct {
	Issuer   string   `json:"iss"`
	Subject  string   `json:"sub"`
	Audience audience `json:"aud"`
	Expiry   int64    `json:"exp"`
	NotAfter int64    `json:"nbf"`
}

// audience is a JWT `aud`: one string or a list.
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*a = audience{one}
		return nil
	}
	return json.Unmarshal(b, (*[]string)(a))
}

func (c *Cloud) assumeRoleWithWebIdentity(form url.Values) (*assumeRoleResponse, *Error) {
	s := &c.iam
	s.mu.Lock()
	cfg := s.cfg
	s.mu.Unlock()
	if cfg == nil {
		return nil, errorf("InvalidAction", "vpcsim: STS answers only with IAM set up (Cloud.SetIAM)")
	}
	if form.Get("Action") != "AssumeRoleWithWebIdentity" {
		return nil, errorf("InvalidAction", "Could not find operation %s for version %s", form.Get("Action"), stsVersion)
	}
	roleARN, sessionName, token := form.Get("RoleArn"), form.Get("RoleSessionName"), form.Get("WebIdentityToken")
	for _, p := range [][2]string{{"RoleArn", roleARN}, {"RoleSessionName", sessionName}, {"WebIdentityToken", token}} {
		if p[1] == "" {
			return nil, errorf("ValidationError", "1 validation error detected: Value null at '%s' failed to satisfy constraint: Member must not be null", strings.ToLower(p[0][:1])+p[0][1:])
		}
	}
	claims, prov, err := verifyToken(cfg.Providers, token, time.Now())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	role, ok := s.roles[roleARN]
	if !ok || role.TrustIssuer != prov.Issuer || !slices.Contains(role.TrustSubjects, claims.Subject) {
		return nil, errorf("AccessDenied", "Not authorized to perform sts:AssumeRoleWithWebIdentity")
	}
	ses := s.newSessionLocked(c, role, sessionName, time.Now())
	res := &assumeRoleResponse{}
	res.Result.Subject, res.Result.Provider = claims.Subject, strings.TrimPrefix(prov.Issuer, "https://")
	res.Result.Audience = claims.Audience[0]
	res.Result.AssumedRole.Arn, res.Result.AssumedRole.ID = ses.principal, "AROAVPCSIM:"+sessionName
	cr := &res.Result.Credentials
	cr.AccessKeyID, cr.SecretAccessKey, cr.SessionToken = ses.key, ses.secret, ses.token
	cr.Expiration = ses.expires.UTC().Format(time.RFC3339)
	return res, nil
}

// verifyToken checks a JWT as STS does for AssumeRoleWithWebIdentity: its
// issuer is one of providers, its signature verifies with one of the
// issuer's keys (RS256, by kid: the algorithm of a Kubernetes API server's
// RSA ServiceAccount signing key, as EKS's), it has not expired, and its
// audience is one the provider accepts.
func verifyToken(providers []OIDCProvider, token string, now time.Time) (jwtClaims, OIDCProvider, *Error) {
	invalid := func(format string, args ...any) (jwtClaims, OIDCProvider, *Error) {
		return jwtClaims{}, OIDCProvider{}, errorf("InvalidIdentityToken", format, args...)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return invalid("The ID Token provided is not a valid JWT. (You may see this error if you sent an Access Token)")
	}
	var hdr struct {
		Alg, Kid string
	}
	var claims jwtClaims
	if decodeSegment(parts[0], &hdr) != nil || decodeSegment(parts[1], &claims) != nil {
		return invalid("The ID Token provided is not a valid JWT. (You may see this error if you sent an Access Token)")
	}
	i := slices.IndexFunc(providers, func(p OIDCProvider) bool { return p.Issuer == claims.Issuer })
	if i < 0 {
		return invalid("No OpenIDConnect provider found in your account for %s", claims.Issuer)
	}
	prov := providers[i]
	jwks, err := prov.JWKS()
	if err != nil {
		return invalid("Couldn't retrieve verification key from your identity provider, please reference AssumeRoleWithWebIdentity documentation for requirements: %v", err)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !verifySignature(jwks, hdr.Alg, hdr.Kid, parts[0]+"."+parts[1], sig) {
		return invalid("Signature verification failed")
	}
	if claims.Expiry == 0 || !now.Before(time.Unix(claims.Expiry, 0)) {
		return jwtClaims{}, OIDCProvider{}, errorf("ExpiredTokenException", "Token expired: current date/time %s must be before the expiration date/time %s",
			now.UTC().Format(time.RFC3339), time.Unix(claims.Expiry, 0).UTC().Format(time.RFC3339))
	}
	if claims.NotAfter != 0 && now.Before(time.Unix(claims.NotAfter, 0).Add(-time.Minute)) {
		return invalid("Token is not valid yet")
	}
	auds := prov.Audiences
	if len(auds) == 0 {
		auds = []string{defaultAudience}
	}
	if !slices.ContainsFunc(claims.Audience, func(a string) bool { return slices.Contains(auds, a) }) {
		return invalid("Incorrect token audience")
	}
	return claims, prov, nil
}

func decodeSegment(seg string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// jwk is one RSA key of a JSON Web Key Set (RFC 7517).
type jwk struct {
	Kty, Kid, Alg string
	N, E          string
}

// verifySignature checks sig over signed with the key of jwks that kid
// names (any key of the right type when kid is empty).
func verifySignature(jwks []byte, alg, kid, signed string, sig []byte) bool {
	var set struct{ Keys []jwk }
	if json.Unmarshal(jwks, &set) != nil {
		return false
	}
	sum := sha256.Sum256([]byte(signed))
	for _, k := range set.Keys {
		if kid != "" && k.Kid != kid || alg != "RS256" || k.Kty != "RSA" {
			continue
		}
		n, err1 := base64.RawURLEncoding.DecodeString(k.N)
		e, err2 := base64.RawURLEncoding.DecodeString(k.E)
		if err1 != nil || err2 != nil {
			continue
		}
		pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
		if rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], sig) == nil {
			return true
		}
	}
	return false
}
