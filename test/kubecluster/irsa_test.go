package kubecluster

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/vpcsim"
)

// The IAM setup of an EKS cluster whose aws-node used IAM roles for service
// accounts (IRSA): the API server's ServiceAccount issuer is the account's
// OIDC provider, the CNI role (AmazonEKS_CNI_Policy) trusts
// kube-system:aws-node, and the node role has only what
// AmazonEKSWorkerNodePolicy gives EC2-wise (describes, no ENI or address
// changes), as EKS's IRSA guide leaves it.
const (
	irsaIssuer   = "https://kubernetes.default.svc" // test/kubetest's --service-account-issuer
	irsaCNIRole  = "arn:aws:iam::111122223333:role/AmazonEKSVPCCNIRole"
	irsaNodeRole = "arn:aws:iam::111122223333:role/eks-node-group"
	awsNodeSA    = "system:serviceaccount:kube-system:aws-node"
	roleARNKey   = "eks.amazonaws.com/role-arn"
)

// workerNodePolicyEC2 are the EC2 actions of AWS's AmazonEKSWorkerNodePolicy.
var workerNodePolicyEC2 = []string{"ec2:DescribeInstances", "ec2:DescribeInstanceTypes", "ec2:DescribeRouteTables",
	"ec2:DescribeSecurityGroups", "ec2:DescribeSubnets", "ec2:DescribeVolumes", "ec2:DescribeVolumesModifications", "ec2:DescribeVpcs"}

// webIdentityValues is what EKS's pod identity webhook (amazon-eks-pod-identity-webhook)
// adds to a pod whose ServiceAccount carries eks.amazonaws.com/role-arn: a
// projected ServiceAccount token for audience sts.amazonaws.com, mounted at
// /var/run/secrets/eks.amazonaws.com/serviceaccount, and the variables that
// point the AWS SDK at it (webIdentityEnv). The webhook is not available
// from the Go module proxy here, so the test adds the same through the
// chart's extraVolumes, extraVolumeMounts and extraEnv.
const webIdentityValues = `extraVolumes:
  - name: aws-iam-token
    projected:
      sources:
        - serviceAccountToken: {audience: sts.amazonaws.com, expirationSeconds: 86400, path: token}
extraVolumeMounts:
  - {name: aws-iam-token, mountPath: /var/run/secrets/eks.amazonaws.com/serviceaccount, readOnly: true}
`

func webIdentityEnv(roleARN, region string) []EnvVar {
	return []EnvVar{{"AWS_STS_REGIONAL_ENDPOINTS", "regional"}, {"AWS_DEFAULT_REGION", region},
		{"AWS_ROLE_ARN", roleARN}, {"AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/secrets/eks.amazonaws.com/serviceaccount/token"}}
}

// TestClusterIRSA: README's install steps 3 to 6 for a user whose aws-node
// had its EC2 permissions through IRSA, on a real cluster whose vpcsim
// checks credentials: STS trades a ServiceAccount token for the CNI role's
// credentials only when the token is the API server's, for sts.amazonaws.com,
// and of kube-system:aws-node; EC2 refuses the node role's credentials
// (IMDS) every ENI and address change.
//
// aws-node's ServiceAccount is there as aws-node left it (annotated with
// the role, labelled k8s-app=aws-node). In order:
//   - step 3's first variant (the chart creates aws-node) while that
//     ServiceAccount is still there: helm install refuses to take it over;
//   - the chart's default ServiceAccount name (vpcip) with the role's
//     annotation: STS refuses the token (AccessDenied), the daemon says so
//     and is never ready;
//   - no web identity (the annotation lost): the SDK falls back to the node
//     role, EC2 refuses (UnauthorizedOperation), the daemon says so and is
//     never ready;
//   - step 3's `serviceAccount: {create: false, name: aws-node}` with the
//     old ServiceAccount: the DaemonSet is ready, a pod gets an address EC2
//     assigned to its node, every EC2 change was made by the CNI role;
//   - the old ServiceAccount deleted (step 4 with the add-on) and step 3's
//     `serviceAccount: {name: aws-node, annotations: {...}, labels: {...}}`:
//     the chart makes it, and the same holds.
func TestClusterIRSA(t *testing.T) {
	image, vpcipctl, h := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	c := startClusterWith(t, ctx, "vi", Options{Image: image, Nodes: 1, DaemonCredentials: []EnvVar{}})
	err := c.Cloud.SetIAM(vpcsim.IAM{
		Providers: []vpcsim.OIDCProvider{{Issuer: irsaIssuer, JWKS: func() ([]byte, error) {
			out, err := c.Kubectl(context.Background(), "get", "--raw", "/openid/v1/jwks")
			return []byte(out), err
		}}},
		Roles: []vpcsim.Role{
			{ARN: irsaCNIRole, TrustIssuer: irsaIssuer, TrustSubjects: []string{awsNodeSA}, Actions: vpcsim.AmazonEKSCNIPolicyActions},
			{ARN: irsaNodeRole, Actions: workerNodePolicyEC2},
		},
		InstanceRole: irsaNodeRole,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &releaseValuesRun{t: t, s: &Scenario{C: c, Helm: h, Vpcipctl: vpcipctl, Logf: t.Logf}}
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	inject := file("web-identity.yaml", webIdentityValues)
	// The daemon's log as kubelet keeps it on the node (what `kubectl logs`
	// shows; the API server cannot reach the kubelets here).
	logs := func() string {
		pods, _ := c.Pods(ctx, "kube-system", "app.kubernetes.io/name=vpcip")
		var b strings.Builder
		for _, p := range pods {
			files, _ := filepath.Glob(c.Nodes[0].path("pod-logs", "kube-system_"+p.Name+"_"+p.UID, "vpcipd", "*.log"))
			for _, f := range files {
				data, _ := os.ReadFile(f)
				b.Write(data)
			}
		}
		l := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
		return strings.Join(l[max(0, len(l)-40):], "\n")
	}
	fail := func(err error) {
		t.Helper()
		t.Fatalf("%v\nvpcipd logs:\n%s\nEC2 calls: %v", err, logs(), c.Cloud.EC2Calls())
	}

	// aws-node's ServiceAccount, as aws-node left it.
	if err := c.Apply(ctx, fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata:
  name: aws-node
  namespace: kube-system
  labels: {k8s-app: aws-node}
  annotations: {%s: %s}
`, roleARNKey, irsaCNIRole)); err != nil {
		t.Fatal(err)
	}
	// Step 3's command reads the ARN.
	arn, err := c.Kubectl(ctx, "-n", "kube-system", "get", "sa", "aws-node", "-o", `jsonpath={.metadata.annotations.eks\.amazonaws\.com/role-arn}`)
	if err != nil || arn != irsaCNIRole {
		t.Fatalf("step 3's kubectl read the ARN %q (%v), want %s", arn, err, irsaCNIRole)
	}
	region := c.Cloud.Region()

	// Step 3's first variant while aws-node's ServiceAccount is still there
	// (aws-node deleted with kubectl): Helm does not take it over.
	create := file("create-sa.yaml", fmt.Sprintf("serviceAccount: {name: aws-node, annotations: {%s: %s}, labels: {k8s-app: aws-node}}\npodLabels: {k8s-app: aws-node}\n", roleARNKey, arn))
	c.DaemonCredentials = webIdentityEnv(arn, region)
	if out, err := c.InstallChartFiles(h, false, []string{create, inject}); err == nil || !strings.Contains(out+err.Error(), "exists and cannot be imported") {
		t.Fatalf("helm install creating aws-node over aws-node's ServiceAccount: %v: %s", err, out)
	} else {
		t.Logf("creating aws-node while aws-node's is there: %v", err)
	}

	// Refused: the chart's own ServiceAccount name with the role.
	c.DaemonCredentials = webIdentityEnv(arn, region)
	refused(t, ctx, r, []string{file("default-name.yaml", fmt.Sprintf("serviceAccount: {annotations: {%s: %s}}\n", roleARNKey, arn)), inject},
		"AccessDenied", logs)
	// Refused: no web identity, the node role's credentials.
	c.DaemonCredentials = []EnvVar{}
	refused(t, ctx, r, []string{file("no-annotation.yaml", "serviceAccount: {create: false, name: aws-node}\n")}, "UnauthorizedOperation", logs)

	// Step 3, aws-node's ServiceAccount kept.
	c.DaemonCredentials = webIdentityEnv(arn, region)
	before := c.Cloud.EC2Calls()
	keep := file("keep-sa.yaml", "serviceAccount: {create: false, name: aws-node}\npodLabels: {k8s-app: aws-node}\n")
	if err := r.install(ctx, false, keep, inject); err != nil {
		fail(err)
	}
	if _, err := r.podPerNode(ctx, "keep"); err != nil {
		fail(err)
	}
	checkCallsByRole(t, before, c.Cloud.EC2Calls())

	// Step 4 deleted aws-node's ServiceAccount; step 3's values make it.
	if out, err := c.Helm(h, "uninstall", Release, "-n", "kube-system", "--wait"); err != nil {
		t.Fatalf("helm uninstall: %v: %s", err, out)
	}
	if _, err := c.Kubectl(ctx, "-n", "kube-system", "delete", "sa", "aws-node"); err != nil {
		t.Fatal(err)
	}
	before = c.Cloud.EC2Calls()
	if err := r.install(ctx, false, create, inject); err != nil {
		fail(err)
	}
	if got, err := c.Kubectl(ctx, "-n", "kube-system", "get", "sa", "aws-node", "-o", `jsonpath={.metadata.annotations.eks\.amazonaws\.com/role-arn} {.metadata.labels.k8s-app}`); err != nil || got != arn+" aws-node" {
		t.Errorf("the chart's ServiceAccount aws-node: role-arn and k8s-app %q (%v), want %q", got, err, arn+" aws-node")
	}
	if _, err := r.podPerNode(ctx, "create"); err != nil {
		fail(err)
	}
	checkCallsByRole(t, before, c.Cloud.EC2Calls())
	t.Logf("total %s; EC2 calls by principal: %v", time.Since(start).Round(100*time.Millisecond), c.Cloud.EC2Calls())
}

// refused installs files and waits until the daemon's log names code, checks
// the DaemonSet is not ready and the node not Ready (no CNI conflist), and
// uninstalls.
func refused(t *testing.T, ctx context.Context, r *releaseValuesRun, files []string, code string, logs func() string) {
	t.Helper()
	c := r.s.C
	start := time.Now()
	if out, err := c.InstallChartFiles(r.s.Helm, false, files); err != nil {
		t.Fatalf("helm install with %v: %v: %s", baseNames(files), err, out)
	}
	var l string
	for l = logs(); !strings.Contains(l, code); l = logs() {
		if time.Since(start) > 3*time.Minute || ctx.Err() != nil {
			desc, _ := c.Kubectl(ctx, "-n", "kube-system", "describe", "pods", "-l", "app.kubernetes.io/name=vpcip")
			t.Fatalf("with %v: after %s the daemon's log does not name %s:\n%s\nEC2 calls: %v\n%s\nkubelet:\n%s", baseNames(files), time.Since(start).Round(time.Second), code, l, c.Cloud.EC2Calls(), desc, tail(c.Nodes[0].KubeletLog(), 20))
		}
		time.Sleep(2 * time.Second)
	}
	for _, line := range strings.Split(l, "\n") {
		if strings.Contains(line, code) {
			t.Logf("with %v, after %s the daemon logs: %s", baseNames(files), time.Since(start).Round(time.Second), line)
			break
		}
	}
	pods, err := c.Pods(ctx, "kube-system", "app.kubernetes.io/name=vpcip")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.Ready {
			t.Errorf("with %v: daemon pod %s is Ready with credentials EC2 or STS refuses", baseNames(files), p.Name)
		}
	}
	if out, err := c.Kubectl(ctx, "-n", "kube-system", "rollout", "status", "ds/"+Release, "--timeout=5s"); err == nil {
		t.Errorf("with %v: rollout status succeeds: %s", baseNames(files), out)
	}
	if out, err := c.Helm(r.s.Helm, "uninstall", Release, "-n", "kube-system", "--wait"); err != nil {
		t.Fatalf("helm uninstall: %v: %s", err, out)
	}
}

// checkCallsByRole checks that, between before and after, the CNI role made
// EC2 calls and no principal had a call refused, and that the node role made
// no ENI or address change.
func checkCallsByRole(t *testing.T, before, after map[string]map[string]int) {
	t.Helper()
	cni, node := "assumed-role/"+roleName(irsaCNIRole)+"/", "assumed-role/"+roleName(irsaNodeRole)+"/"
	var byCNI int
	var shown []string
	for _, p := range slices.Sorted(maps.Keys(after)) {
		for _, k := range slices.Sorted(maps.Keys(after[p])) {
			d := after[p][k] - before[p][k]
			if d == 0 {
				continue
			}
			shown = append(shown, fmt.Sprintf("%s %s×%d", p[strings.LastIndex(p, ":")+1:], k, d))
			switch {
			case strings.Contains(k, ":"):
				t.Errorf("%s: %d refused (%s)", p, d, k)
			case strings.Contains(p, cni):
				byCNI += d
			case strings.Contains(p, node) && !strings.HasPrefix(k, "Describe"):
				t.Errorf("the node role made %s", k)
			}
		}
	}
	t.Logf("   EC2 calls: %s", strings.Join(shown, ", "))
	if byCNI == 0 {
		t.Errorf("no EC2 call made with the CNI role's credentials")
	}
}

func roleName(arn string) string { return arn[strings.LastIndex(arn, "/")+1:] }
