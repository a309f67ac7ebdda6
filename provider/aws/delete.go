package awsprovider

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcip/vpcip/provider"
)

// DeleteENI detaches an ENI from this instance (EC2 DetachNetworkInterface),
// waits, polling EC2 DescribeNetworkInterfaces for at most Options.DetachWait,
// until it is available, and deletes it (EC2 DeleteNetworkInterface). An ENI
// already gone is success, as is one already detached. It refuses, without
// calling EC2 to change anything, an ENI at device number 0 or attached to
// another instance.
func (c *Client) DeleteENI(ctx context.Context, eniID string) error {
	id, err := c.identity(ctx)
	if err != nil {
		return err
	}
	ni, err := c.describeENI(ctx, eniID)
	if errors.Is(err, provider.ErrNotFound) {
		c.meta.detached(eniID)
		return nil
	}
	if err != nil {
		return err
	}
	if a := ni.Attachment; a != nil && a.Status != types.AttachmentStatusDetached {
		if inst := aws.ToString(a.InstanceId); inst != id.instanceID {
			return fmt.Errorf("DeleteENI: %s is attached to %s, not to this instance %s", eniID, inst, id.instanceID)
		}
		if aws.ToInt32(a.DeviceIndex) == 0 {
			return fmt.Errorf("DeleteENI: %s is the primary ENI (device 0) of %s", eniID, id.instanceID)
		}
		if err := c.detach(ctx, eniID, ni); err != nil {
			return err
		}
	}
	c.meta.detached(eniID)
	_, err = call(finishing(ctx), c, actDeleteNetworkInterface, func(ctx context.Context) (*ec2.DeleteNetworkInterfaceOutput, error) {
		return c.ec2.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: aws.String(eniID)})
	})
	if errors.Is(err, provider.ErrNotFound) {
		return nil
	}
	return err
}

// detach detaches ni unless it is already detaching, then waits until EC2
// reports it available (or gone).
func (c *Client) detach(ctx context.Context, eniID string, ni types.NetworkInterface) error {
	if ni.Attachment.Status != types.AttachmentStatusDetaching {
		_, err := call(ctx, c, actDetachNetworkInterface, func(ctx context.Context) (*ec2.DetachNetworkInterfaceOutput, error) {
			return c.ec2.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: ni.Attachment.AttachmentId})
		})
		if err != nil && !errors.Is(err, provider.ErrNotFound) {
			return err
		}
	}
	deadline := time.Now().Add(c.opts.DetachWait)
	poll := c.opts.DetachPoll
	for {
		cur, err := c.describeENI(ctx, eniID)
		if errors.Is(err, provider.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if cur.Status == types.NetworkInterfaceStatusAvailable {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("DeleteENI: %s still %s after %s of detaching", eniID, cur.Status, c.opts.DetachWait)
		}
		if err := provider.Sleep(ctx, min(poll, left)); err != nil {
			return fmt.Errorf("DeleteENI: waiting for %s to detach: %w", eniID, err)
		}
		poll = min(2*poll, 2*time.Second)
	}
}

// DeleteLeakedENIs deletes the ENIs of this cluster (TagCluster, or one of
// Options.LeakTagKeys, equal to Options.ClusterName) that are available (not
// attached) and older than grace, and returns their ids, sorted. Age comes
// from TagCreatedAt; an ENI without it counts from the first time this
// client saw it leaked. It uses EC2 DescribeNetworkInterfaces (filters
// tag:<key> and status=available, every page) and DeleteNetworkInterface. An
// ENI attached or deleted meanwhile is skipped. Errors of single deletes are
// joined; the other ENIs are still tried.
func (c *Client) DeleteLeakedENIs(ctx context.Context, grace time.Duration) ([]string, error) {
	keys := append([]string{TagCluster}, c.opts.LeakTagKeys...)
	candidates := map[string]types.NetworkInterface{}
	for _, key := range keys {
		nis, err := c.describeENIs(ctx, []types.Filter{
			filter("tag:"+key, c.opts.ClusterName), filter("status", string(types.NetworkInterfaceStatusAvailable)),
		})
		if err != nil {
			return nil, err
		}
		for _, ni := range nis {
			candidates[aws.ToString(ni.NetworkInterfaceId)] = ni
		}
	}
	now := time.Now()
	var deleted []string
	var errs []error
	for _, id := range c.oldLeaks(candidates, now, grace) {
		_, err := call(ctx, c, actDeleteNetworkInterface, func(ctx context.Context) (*ec2.DeleteNetworkInterfaceOutput, error) {
			return c.ec2.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: aws.String(id)})
		})
		switch {
		case err == nil:
			deleted = append(deleted, id)
			c.log.Info("deleted leaked ENI", "eni", id)
		case errors.Is(err, provider.ErrNotFound):
		case ctx.Err() != nil:
			return deleted, errors.Join(append(errs, err)...)
		default:
			errs = append(errs, err) // e.g. attached meanwhile (InvalidNetworkInterface.InUse)
		}
	}
	return deleted, errors.Join(errs...)
}

// oldLeaks returns, sorted, the candidates older than grace, and remembers
// when it first saw candidates that carry no creation tag.
func (c *Client) oldLeaks(candidates map[string]types.NetworkInterface, now time.Time, grace time.Duration) []string {
	c.cacheMu.Lock()
	defer c.cacheMu.Unlock()
	for id := range c.leakSeen {
		if _, ok := candidates[id]; !ok {
			delete(c.leakSeen, id)
		}
	}
	var old []string
	for id, ni := range candidates {
		born, ok := createdAt(ni)
		if !ok {
			if _, seen := c.leakSeen[id]; !seen {
				c.leakSeen[id] = now
			}
			born = c.leakSeen[id]
		}
		if now.Sub(born) >= grace {
			old = append(old, id)
		}
	}
	slices.Sort(old)
	return old
}

func createdAt(ni types.NetworkInterface) (time.Time, bool) {
	for _, t := range ni.TagSet {
		if aws.ToString(t.Key) == TagCreatedAt {
			at, err := time.Parse(time.RFC3339, aws.ToString(t.Value))
			return at, err == nil
		}
	}
	return time.Time{}, false
}
