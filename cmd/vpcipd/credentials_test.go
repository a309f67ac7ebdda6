package main

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// TestRefusedCredentialsNamed: a daemon whose AWS credentials EC2 or STS
// refuses (an IRSA setup that did not carry over from aws-node) is never
// ready and its log names the refusal. vpcsim's IAM has the node role of an
// EKS node (describes only) on the instance, and a CNI role that trusts
// kube-system:aws-node only:
//   - no web identity: the SDK's chain takes the node role from IMDS and EC2
//     answers UnauthorizedOperation;
//   - the token of another ServiceAccount: STS answers AccessDenied.
func TestRefusedCredentialsNamed(t *testing.T) {
	bin := buildDaemon(t)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	const issuer = "https://kubernetes.default.svc"
	jwks := func() ([]byte, error) {
		b64 := base64.RawURLEncoding.EncodeToString
		return json.Marshal(map[string]any{"keys": []map[string]string{{"kty": "RSA", "kid": "k", "n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes())}}})
	}
	l := vpcsimtest.Start(t, vpcsim.Config{Seed: 1})
	const cniRole, nodeRole = "arn:aws:iam::111122223333:role/cni", "arn:aws:iam::111122223333:role/node"
	err = l.Cloud.SetIAM(vpcsim.IAM{
		Providers: []vpcsim.OIDCProvider{{Issuer: issuer, JWKS: jwks}},
		Roles: []vpcsim.Role{
			{ARN: cniRole, TrustIssuer: issuer, TrustSubjects: []string{"system:serviceaccount:kube-system:aws-node"}, Actions: vpcsim.AmazonEKSCNIPolicyActions},
			{ARN: nodeRole, Actions: []string{"ec2:DescribeInstances", "ec2:DescribeInstanceTypes", "ec2:DescribeSubnets"}},
		},
		InstanceRole: nodeRole,
	})
	if err != nil {
		t.Fatal(err)
	}
	inst := l.Launch(t, "m5.large")
	token := func(sub string) string {
		enc := func(v any) string { b, _ := json.Marshal(v); return base64.RawURLEncoding.EncodeToString(b) }
		signed := enc(map[string]string{"alg": "RS256", "kid": "k"}) + "." +
			enc(map[string]any{"iss": issuer, "sub": sub, "aud": []string{"sts.amazonaws.com"}, "exp": time.Now().Add(time.Hour).Unix()})
		sum := sha256.Sum256([]byte(signed))
		sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
		if err != nil {
			t.Fatal(err)
		}
		return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
	}
	cases := []struct {
		name, sub, want string
	}{
		{"node role from IMDS", "", "UnauthorizedOperation"},
		{"token of another ServiceAccount", "system:serviceaccount:kube-system:vpcip", "AccessDenied"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := shortDir(t)
			var env []string
			for _, e := range daemonEnv(l, inst.ID, dir) {
				if !strings.HasPrefix(e, "AWS_ACCESS_KEY_ID=") && !strings.HasPrefix(e, "AWS_SECRET_ACCESS_KEY=") {
					env = append(env, e)
				}
			}
			if tc.sub != "" {
				file := filepath.Join(dir, "token")
				if err := os.WriteFile(file, []byte(token(tc.sub)), 0o600); err != nil {
					t.Fatal(err)
				}
				env = append(env, "AWS_ROLE_ARN="+cniRole, "AWS_WEB_IDENTITY_TOKEN_FILE="+file, "AWS_ENDPOINT_URL_STS="+l.EC2URL)
			}
			cmd := exec.Command(bin)
			cmd.Env = env
			logPath := filepath.Join(dir, "vpcipd.log")
			logf, err := os.Create(logPath)
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr, cmd.Stdout = logf, logf
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			logf.Close()
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			client := api.NewClient(filepath.Join(dir, "s.sock"), 5*time.Second)
			deadline := time.Now().Add(60 * time.Second)
			for {
				log, _ := os.ReadFile(logPath)
				if strings.Contains(string(log), tc.want) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after 60 s the log does not name %s:\n%s", tc.want, log)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if st, err := client.Status(context.Background()); err == nil && st.Ready {
				t.Fatalf("daemon ready with refused credentials: %+v", st)
			}
		})
	}
}
