package fabric

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/vpcip/vpcip/test/vpcsim"
)

// Servers are a cloud's EC2 API and IMDS served inside the fabric, on
// EC2Addr and IMDSAddr.
type Servers struct {
	ec2, imds *http.Server
}

// Serve starts c's EC2 API on EC2Addr and EC2Addr6 and its IMDS on
// IMDSAddr and IMDSAddr6 inside the router netns. IMDS answers each caller
// for the instance whose primary address (or primary IPv6 address) the
// request comes from (CallerInstance). Stop them with Close.
func (f *Fabric) Serve(c *vpcsim.Cloud) (*Servers, error) {
	var ls [4]net.Listener
	for i, addr := range []string{EC2Addr, EC2Addr6, IMDSAddr, IMDSAddr6} {
		l, err := f.Listen(addr)
		if err != nil {
			for _, l := range ls[:i] {
				l.Close()
			}
			return nil, err
		}
		ls[i] = l
	}
	s := &Servers{
		ec2:  &http.Server{Handler: c.EC2Handler(), ReadHeaderTimeout: 10 * time.Second},
		imds: &http.Server{Handler: c.IMDSHandler(CallerInstance(c)), ReadHeaderTimeout: 10 * time.Second},
	}
	go s.ec2.Serve(ls[0])
	go s.ec2.Serve(ls[1])
	go s.imds.Serve(ls[2])
	go s.imds.Serve(ls[3])
	return s, nil
}

// Close stops both servers, waiting up to 2 s for requests in flight.
func (s *Servers) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var errs []error
	for _, srv := range []*http.Server{s.ec2, s.imds} {
		if err := srv.Shutdown(ctx); err != nil {
			errs = append(errs, srv.Close())
		}
	}
	return errors.Join(errs...)
}

// CallerInstance identifies an IMDS caller as EC2 does, by the source
// address of the request: the instance whose ENI has it as primary address
// or primary IPv6 address (the ENI's first IPv6 address). Callers whose
// address is neither get no answer (404).
func CallerInstance(c *vpcsim.Cloud) func(r *http.Request) (string, bool) {
	return func(r *http.Request) (string, bool) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil {
			return "", false
		}
		return c.InstanceByAddress(ap.Addr().Unmap())
	}
}

// NodeEnv is the environment for a process inside an instance netns that
// uses the AWS SDK: the EC2 and IMDS endpoints inside the fabric, the
// region, and dummy credentials (vpcsim does not check signatures).
func NodeEnv(region string) []string {
	return []string{
		"AWS_ENDPOINT_URL_EC2=" + EC2URL,
		"AWS_EC2_METADATA_SERVICE_ENDPOINT=" + IMDSURL,
		"AWS_REGION=" + region,
		"AWS_ACCESS_KEY_ID=vpcsim",
		"AWS_SECRET_ACCESS_KEY=vpcsim",
	}
}

// DialContext returns a dial function that makes its sockets inside the named
// netns (under the fabric's netns directory), for an http.Transport used by a
// process outside it (a test) to speak as that instance.
func DialContext(netnsName string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return DialContextPath(netnsPath(netnsName))
}

// DialContextPath is DialContext for a netns given by its path (a bind mount
// or /proc/<pid>/ns/net, as a pod's sandbox under kubelet). Each dial gives up
// after 3 seconds.
func DialContextPath(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
			var err error
			c, err = (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("dial %s from %s: %w", addr, nsPath, err)
		}
		return c, nil
	}
}

// IMDSToken asks the fabric's IMDS for an IMDSv2 session token (PUT
// /latest/api/token, as the AWS SDKs do first) from inside the netns at
// nsPath. It returns nil when a token came back, the dial's error (wrapping
// e.g. syscall.ECONNREFUSED when the datapath refuses the caller) or the
// status IMDS answered otherwise. Gives up after 5 seconds.
func IMDSToken(ctx context.Context, nsPath string) error {
	client := &http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{DialContext: DialContextPath(nsPath), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, IMDSURL+"/latest/api/token", nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "60")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || len(b) == 0 {
		return fmt.Errorf("IMDS answered %s", resp.Status)
	}
	return nil
}
