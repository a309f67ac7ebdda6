package vpcsim_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"

	"github.com/vpcip/vpcip/test/vpcsim/vpcsimtest"
)

func imdsGet(t *testing.T, md *imds.Client, path string) string {
	t.Helper()
	out, err := md.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer out.Content.Close()
	b, err := io.ReadAll(out.Content)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// rawIMDS does one request against an IMDS listener and returns the status and body.
func rawIMDS(t *testing.T, method, url string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestIMDSTokens(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	a := launchIn(t, l, "m5.large", subnetBig)
	b := launchIn(t, l, "m5.large", subnetBig)
	urlA, urlB := l.IMDSURL(a.ID), l.IMDSURL(b.ID)
	if code, _ := rawIMDS(t, "GET", urlA+"/latest/meta-data/instance-id", nil); code != 401 {
		t.Fatalf("GET without token: HTTP %d, want 401", code)
	}
	if code, _ := rawIMDS(t, "PUT", urlA+"/latest/api/token", nil); code != 400 {
		t.Fatalf("PUT without TTL: HTTP %d, want 400", code)
	}
	if code, _ := rawIMDS(t, "PUT", urlA+"/latest/api/token", map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "21601"}); code != 400 {
		t.Fatalf("PUT with TTL over 6h: HTTP %d, want 400", code)
	}
	code, tok := rawIMDS(t, "PUT", urlA+"/latest/api/token", map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "60"})
	if code != 200 || tok == "" {
		t.Fatalf("PUT token: HTTP %d %q", code, tok)
	}
	hdr := map[string]string{"X-aws-ec2-metadata-token": tok}
	if code, body := rawIMDS(t, "GET", urlA+"/latest/meta-data/instance-id", hdr); code != 200 || body != a.ID {
		t.Fatalf("GET with token: HTTP %d %q", code, body)
	}
	if code, _ := rawIMDS(t, "GET", urlB+"/latest/meta-data/instance-id", hdr); code != 401 {
		t.Fatalf("A's token on B: HTTP %d, want 401", code)
	}
	if code, _ := rawIMDS(t, "GET", urlA+"/latest/meta-data/no-such-key", hdr); code != 404 {
		t.Fatalf("unknown path: HTTP %d, want 404", code)
	}
	if code, _ := rawIMDS(t, "PUT", urlA+"/latest/api/token", map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "1.2.3.4"}); code != 403 {
		t.Fatalf("forwarded token request: HTTP %d, want 403", code)
	}
}

func TestIMDSSecondaryENIAndPrefixes(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	eni := createENI(t, cli, subnetBig)
	attach(t, cli, eni, inst.ID, 1)
	ips := assign(t, cli, eni, 2)
	pf := assignPrefixes(t, cli, inst.PrimaryENI.ID, 2)
	md := imdsClient(l, inst.ID)
	e := mustENI(t, l.Cloud, eni)
	base := "network/interfaces/macs/" + e.MAC + "/"
	macs := strings.Split(imdsGet(t, md, "network/interfaces/macs/"), "\n")
	if len(macs) != 2 {
		t.Fatalf("macs listing: %q", macs)
	}
	checks := map[string]string{
		base + "device-number": "1",
		base + "network-card":  "0",
		base + "interface-id":  eni,
		base + "local-ipv4s":   e.PrimaryIP.String() + "\n" + strings.Join(ips, "\n"),
		base + "subnet-id":     subnetBig,
		base + "vpc-id":        l.Cloud.VPCID(),
		"network/interfaces/macs/" + inst.PrimaryENI.MAC + "/ipv4-prefix":        strings.Join(pf, "\n"),
		"network/interfaces/macs/" + inst.PrimaryENI.MAC + "/security-group-ids": strings.Join(inst.PrimaryENI.SecurityGroups, "\n"),
	}
	for path, want := range checks {
		if got := imdsGet(t, md, path); got != want {
			t.Errorf("%s: got %q, want %q", path, got, want)
		}
	}
	if _, err := md.GetMetadata(ctx, &imds.GetMetadataInput{Path: base + "ipv4-prefix"}); err == nil {
		t.Error("ipv4-prefix of an ENI without prefixes answered; IMDS answers 404")
	}
}

func TestIMDSLag(t *testing.T) {
	l := vpcsimtest.Start(t, testConfig())
	cli := ec2Client(l)
	inst := launchIn(t, l, "m5.large", subnetBig)
	md := imdsClient(l, inst.ID)
	path := "network/interfaces/macs/" + inst.PrimaryENI.MAC + "/local-ipv4s"
	before := imdsGet(t, md, path)
	l.Cloud.Faults().SetIMDSLag(time.Hour)
	ips := assign(t, cli, inst.PrimaryENI.ID, 2)
	eni := createENI(t, cli, subnetBig)
	attach(t, cli, eni, inst.ID, 1)
	if got := imdsGet(t, md, path); got != before {
		t.Fatalf("with an hour of lag IMDS shows %q, want the old %q", got, before)
	}
	if macs := imdsGet(t, md, "network/interfaces/macs/"); strings.Count(macs, "/") != 1 {
		t.Fatalf("with lag the new ENI's MAC is listed: %q", macs)
	}
	l.Cloud.Faults().SetIMDSLag(0)
	if got, want := imdsGet(t, md, path), before+"\n"+strings.Join(ips, "\n"); got != want {
		t.Fatalf("without lag: got %q, want %q", got, want)
	}
	if macs := imdsGet(t, md, "network/interfaces/macs/"); strings.Count(macs, "/") != 2 {
		t.Fatalf("without lag the new ENI is missing: %q", macs)
	}
}
