package vpcsim_test

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/credentials/stscreds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

const (
	testIssuer  = "https://oidc.eks.us-west-2.amazonaws.com/id/VPCSIMTEST"
	awsNodeSub  = "system:serviceaccount:kube-system:aws-node"
	cniRoleARN  = "arn:aws:iam::111122223333:role/eks-cni"
	nodeRoleARN = "arn:aws:iam::111122223333:role/eks-node"
)

// oidcIssuer is a test OIDC issuer: an RSA key, served as a JWKS, that
// signs tokens shaped like a Kubernetes projected ServiceAccount token.
type oidcIssuer struct {
	key *rsa.PrivateKey
	kid string
}

func newIssuer(t *testing.T) *oidcIssuer {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return &oidcIssuer{key: k, kid: "k1"}
}

func (o *oidcIssuer) jwks() ([]byte, error) {
	b64 := base64.RawURLEncoding.EncodeToString
	return json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "alg": "RS256", "use": "sig", "kid": o.kid,
		"n": b64(o.key.N.Bytes()), "e": b64(big.NewInt(int64(o.key.E)).Bytes()),
	}}})
}

// token signs claims with key (o.key when nil).
func (o *oidcIssuer) token(t *testing.T, key *rsa.PrivateKey, claims map[string]any) string {
	t.Helper()
	if key == nil {
		key = o.key
	}
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signed := enc(map[string]string{"alg": "RS256", "kid": o.kid}) + "." + enc(claims)
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func saClaims(sub, aud string, exp time.Time) map[string]any {
	return map[string]any{"iss": testIssuer, "sub": sub, "aud": []string{aud},
		"exp": exp.Unix(), "iat": time.Now().Unix(), "nbf": time.Now().Unix()}
}

// irsaCloud is a cloud with an EKS-like IAM setup: a node role without EC2
// network permissions on every instance's profile, and a role with
// AmazonEKS_CNI_Policy's actions that trusts kube-system:aws-node.
func irsaCloud(t *testing.T, iss *oidcIssuer) *vpcsimtest.Local {
	t.Helper()
	l := vpcsimtest.Start(t, vpcsim.Config{Seed: 1})
	err := l.Cloud.SetIAM(vpcsim.IAM{
		Providers: []vpcsim.OIDCProvider{{Issuer: testIssuer, JWKS: iss.jwks}},
		Roles: []vpcsim.Role{
			{ARN: cniRoleARN, TrustIssuer: testIssuer, TrustSubjects: []string{awsNodeSub}, Actions: vpcsim.AmazonEKSCNIPolicyActions},
			{ARN: nodeRoleARN, Actions: []string{"ec2:DescribeInstances"}},
		},
		InstanceRole: nodeRoleARN,
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// webIdentityEC2 is an EC2 client whose credentials come from aws-sdk-go-v2's
// web identity provider (stscreds), as LoadDefaultConfig builds it from
// AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE, with STS at vpcsim.
func webIdentityEC2(t *testing.T, l *vpcsimtest.Local, roleARN, token string) *ec2.Client {
	t.Helper()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	stsc := sts.New(sts.Options{Region: "us-west-2", BaseEndpoint: aws.String(l.EC2URL), RetryMaxAttempts: 1})
	prov := stscreds.NewWebIdentityRoleProvider(stsc, roleARN, stscreds.IdentityTokenFile(file))
	return ec2.New(ec2.Options{Region: "us-west-2", BaseEndpoint: aws.String(l.EC2URL),
		Credentials: aws.NewCredentialsCache(prov), RetryMaxAttempts: 1})
}

// TestIRSAThroughDefaultConfig: the AWS SDK's default credential chain,
// given what EKS's pod identity webhook injects (AWS_ROLE_ARN,
// AWS_WEB_IDENTITY_TOKEN_FILE) and STS's endpoint (AWS_ENDPOINT_URL_STS),
// trades the ServiceAccount token for the role's credentials at vpcsim's
// STS, and EC2 serves the role's actions to them, recording the calls
// under the assumed role.
func TestIRSAThroughDefaultConfig(t *testing.T) {
	iss := newIssuer(t)
	l := irsaCloud(t, iss)
	inst := l.Launch(t, "m5.large")
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(iss.token(t, nil, saClaims(awsNodeSub, "sts.amazonaws.com", time.Now().Add(time.Hour)))), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"AWS_ROLE_ARN": cniRoleARN, "AWS_WEB_IDENTITY_TOKEN_FILE": file, "AWS_ROLE_SESSION_NAME": "vpcipd",
		"AWS_ENDPOINT_URL_STS": l.EC2URL, "AWS_ENDPOINT_URL_EC2": l.EC2URL, "AWS_REGION": "us-west-2",
		"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
		"AWS_EC2_METADATA_DISABLED": "true",
	} {
		t.Setenv(k, v)
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cli := ec2.NewFromConfig(cfg)
	out, err := cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(inst.SubnetID)})
	if err != nil {
		t.Fatalf("CreateNetworkInterface with the role's credentials: %v", err)
	}
	creds, err := cfg.Credentials.Retrieve(ctx)
	if err != nil || !strings.HasPrefix(creds.AccessKeyID, "ASIA") || creds.Source != stscreds.WebIdentityProviderName {
		t.Fatalf("credentials %+v (%v), want temporary ones from the web identity provider", creds, err)
	}
	calls := l.Cloud.EC2Calls()
	principal := "arn:aws:sts::111122223333:assumed-role/eks-cni/vpcipd"
	if calls[principal]["CreateNetworkInterface"] != 1 || len(calls) != 1 {
		t.Fatalf("EC2 calls by principal: %v, want one CreateNetworkInterface by %s", calls, principal)
	}
	mustENI(t, l.Cloud, aws.ToString(out.NetworkInterface.NetworkInterfaceId))
}

// TestIRSARefusals: each way a web identity is refused, as STS and EC2
// refuse it, through the SDK's web identity provider.
func TestIRSARefusals(t *testing.T) {
	iss := newIssuer(t)
	l := irsaCloud(t, iss)
	inst := l.Launch(t, "m5.large")
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	hour := time.Now().Add(time.Hour)
	cases := []struct {
		name, role, token string
		code              string
		status            int
	}{
		{"signed by another key", cniRoleARN, iss.token(t, other, saClaims(awsNodeSub, "sts.amazonaws.com", hour)), "InvalidIdentityToken", 400},
		{"not a JWT", cniRoleARN, "not.a-token", "InvalidIdentityToken", 400},
		{"expired", cniRoleARN, iss.token(t, nil, saClaims(awsNodeSub, "sts.amazonaws.com", time.Now().Add(-time.Minute))), "ExpiredTokenException", 400},
		{"wrong audience", cniRoleARN, iss.token(t, nil, saClaims(awsNodeSub, "https://kubernetes.default.svc", hour)), "InvalidIdentityToken", 400},
		{"unknown issuer", cniRoleARN, iss.token(t, nil, map[string]any{"iss": "https://elsewhere", "sub": awsNodeSub, "aud": "sts.amazonaws.com", "exp": hour.Unix()}), "InvalidIdentityToken", 400},
		{"ServiceAccount the role does not trust", cniRoleARN, iss.token(t, nil, saClaims("system:serviceaccount:kube-system:vpcip", "sts.amazonaws.com", hour)), "AccessDenied", 403},
		{"role that trusts no web identity", nodeRoleARN, iss.token(t, nil, saClaims(awsNodeSub, "sts.amazonaws.com", hour)), "AccessDenied", 403},
		{"no such role", "arn:aws:iam::111122223333:role/nope", iss.token(t, nil, saClaims(awsNodeSub, "sts.amazonaws.com", hour)), "AccessDenied", 403},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := webIdentityEC2(t, l, tc.role, tc.token).DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{})
			if err == nil || !strings.Contains(err.Error(), "AssumeRoleWithWebIdentity") {
				t.Fatalf("got %v, want STS's refusal through the web identity provider", err)
			}
			wantAPIError(t, err, tc.code, tc.status)
		})
	}
	if calls := l.Cloud.EC2Calls(); len(calls) != 0 {
		t.Fatalf("EC2 calls %v made without credentials", calls)
	}

	t.Run("EC2 action the role does not allow", func(t *testing.T) {
		cli := webIdentityEC2(t, l, cniRoleARN, iss.token(t, nil, saClaims(awsNodeSub, "sts.amazonaws.com", hour)))
		_, err := cli.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{inst.ID}})
		wantAPIError(t, err, "UnauthorizedOperation", 403)
		if _, ok := l.Cloud.Instance(inst.ID); !ok {
			t.Fatal("refused TerminateInstances terminated the instance")
		}
		if n := l.Cloud.EC2Calls()["arn:aws:sts::111122223333:assumed-role/eks-cni/"+sessionNameOf(t, l)]["TerminateInstances:UnauthorizedOperation"]; n != 1 {
			t.Fatalf("refused TerminateInstances counted %d times, want 1: %v", n, l.Cloud.EC2Calls())
		}
	})
	t.Run("unsigned and unknown credentials", func(t *testing.T) {
		_, err := ec2Client(l).DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{})
		wantAPIError(t, err, "AuthFailure", 401)
		req, _ := http.NewRequest(http.MethodPost, l.EC2URL, strings.NewReader("Action=DescribeSubnets&Version=2016-11-15"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Fatalf("unsigned request: HTTP %d, want 401", resp.StatusCode)
		}
	})
	t.Run("wrong secret", func(t *testing.T) {
		good, err := webIdentityEC2(t, l, cniRoleARN, iss.token(t, nil, saClaims(awsNodeSub, "sts.amazonaws.com", hour))).Options().Credentials.Retrieve(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cli := ec2.New(ec2.Options{Region: "us-west-2", BaseEndpoint: aws.String(l.EC2URL), RetryMaxAttempts: 1,
			Credentials: credentials.NewStaticCredentialsProvider(good.AccessKeyID, good.SecretAccessKey+"x", good.SessionToken)})
		_, err = cli.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{})
		wantAPIError(t, err, "AuthFailure", 401)
	})
}

// sessionNameOf is the session name aws-sdk-go-v2's web identity provider
// gives when none is set: a number, so the test reads it from the calls.
func sessionNameOf(t *testing.T, l *vpcsimtest.Local) string {
	t.Helper()
	for p := range l.Cloud.EC2Calls() {
		if name, ok := strings.CutPrefix(p, "arn:aws:sts::111122223333:assumed-role/eks-cni/"); ok {
			return name
		}
	}
	t.Fatalf("no call by the eks-cni role: %v", l.Cloud.EC2Calls())
	return ""
}

// TestInstanceProfileCredentials: with IAM set up, IMDS serves the node
// role's credentials, the SDK's default chain picks them up, and EC2 refuses
// what the node role does not allow (the user who dropped the CNI policy
// from the node role for IRSA, and whose daemon falls back to the node's).
func TestInstanceProfileCredentials(t *testing.T) {
	l := irsaCloud(t, newIssuer(t))
	inst := l.Launch(t, "m5.large")
	for k, v := range map[string]string{
		"AWS_EC2_METADATA_SERVICE_ENDPOINT": l.IMDSURL(inst.ID), "AWS_ENDPOINT_URL_EC2": l.EC2URL, "AWS_REGION": "us-west-2",
		"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_ROLE_ARN": "", "AWS_WEB_IDENTITY_TOKEN_FILE": "",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		t.Setenv(k, v)
	}
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRetryMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	cli := ec2.NewFromConfig(cfg)
	if _, err := cli.DescribeInstances(ctx, &ec2.DescribeInstancesInput{}); err != nil {
		t.Fatalf("DescribeInstances, which the node role allows: %v", err)
	}
	_, err = cli.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(inst.SubnetID)})
	wantAPIError(t, err, "UnauthorizedOperation", 403)
	principal := "arn:aws:sts::111122223333:assumed-role/eks-node/" + inst.ID
	if c := l.Cloud.EC2Calls()[principal]; c["DescribeInstances"] != 1 || c["CreateNetworkInterface:UnauthorizedOperation"] != 1 {
		t.Fatalf("calls by %s: %v", principal, l.Cloud.EC2Calls())
	}
}
