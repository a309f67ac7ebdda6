package vpcsimtest_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

// TestEnvReachesTheCloud loads the SDK's standard configuration from Env
// alone, as a daemon process would, and reads both the API and IMDS.
func TestEnvReachesTheCloud(t *testing.T) {
	l := vpcsimtest.Start(t, vpcsim.Config{})
	inst := l.Launch(t, "m5.large")
	for _, kv := range l.Env(inst.ID) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ec2.NewFromConfig(cfg).DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{inst.ID}})
	if err != nil || len(out.Reservations) != 1 {
		t.Fatalf("DescribeInstances: %v %v", out, err)
	}
	md, err := imds.NewFromConfig(cfg).GetMetadata(ctx, &imds.GetMetadataInput{Path: "instance-id"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(md.Content)
	if string(b) != inst.ID {
		t.Fatalf("IMDS instance-id %q, want %s", b, inst.ID)
	}
}
