package awsprovider

import (
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// TestLeakTagKeys: ENIs another plugin left, tagged with its own cluster
// key and no creation time, count from the first time they are seen, and
// only when their key is configured.
func TestLeakTagKeys(t *testing.T) {
	const key = "cluster.k8s.amazonaws.com/name"
	s := startSim(t)
	out, err := s.raw(t).CreateNetworkInterface(t.Context(), &ec2.CreateNetworkInterfaceInput{
		SubnetId: aws.String(s.inst.SubnetID),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface,
			Tags: ec2Tags(map[string]string{key: testCluster})}},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := aws.ToString(out.NetworkInterface.NetworkInterfaceId)

	plain := s.client(t, testOptions(), "")
	if got, err := plain.DeleteLeakedENIs(t.Context(), 0); err != nil || len(got) != 0 {
		t.Errorf("without LeakTagKeys: DeleteLeakedENIs(0) = %v, %v; want nothing", got, err)
	}
	opts := testOptions()
	opts.LeakTagKeys = []string{key}
	c := s.client(t, opts, "")
	if got, err := c.DeleteLeakedENIs(t.Context(), time.Hour); err != nil || len(got) != 0 {
		t.Errorf("first sight, grace 1h: DeleteLeakedENIs = %v, %v; want nothing (no creation tag: age counts from now)", got, err)
	}
	if _, ok := s.local.Cloud.NetworkInterface(id); !ok {
		t.Fatalf("%s deleted too early", id)
	}
	got, err := c.DeleteLeakedENIs(t.Context(), 0)
	if err != nil || !slices.Equal(got, []string{id}) {
		t.Errorf("grace 0: DeleteLeakedENIs = %v, %v; want [%s]", got, err, id)
	}
	if _, ok := s.local.Cloud.NetworkInterface(id); ok {
		t.Errorf("%s is still in the cloud", id)
	}
}
