package metricsauth_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/vpcip/vpcip/ipamd/metricsauth"
)

// writePair writes a self-signed certificate for cn as tls.crt and tls.key
// in dir, as a mounted kubernetes.io/tls Secret holds them.
func writePair(t *testing.T, dir, cn string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{"tls.crt": {Type: "CERTIFICATE", Bytes: der}, "tls.key": {Type: "EC PRIVATE KEY", Bytes: kder}} {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// servedCN is the common name of the certificate a TLS listener presents.
func servedCN(t *testing.T, addr string) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// TestCertificateFromDirectory: with TLSDir the listener presents that
// directory's pair, and a new pair written there (a Secret updated) is
// presented from the next handshake on, without a restart; a broken pair
// keeps the last good one. Without TLSDir a self-signed certificate names
// the hosts given.
func TestCertificateFromDirectory(t *testing.T) {
	dir := t.TempDir()
	writePair(t, dir, "first")
	g, err := metricsauth.New(metricsauth.Options{Client: &kubernetes.Clientset{}, TLSDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", g.TLSConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	addr := ln.Addr().String()
	if cn := servedCN(t, addr); cn != "first" {
		t.Fatalf("served %q, want the directory's certificate", cn)
	}
	time.Sleep(10 * time.Millisecond) // a distinct modification time
	writePair(t, dir, "second")
	if cn := servedCN(t, addr); cn != "second" {
		t.Errorf("after the pair was replaced: served %q, want the new one", cn)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cn := servedCN(t, addr); cn != "second" {
		t.Errorf("with a broken key: served %q, want the last good certificate", cn)
	}

	g, err = metricsauth.New(metricsauth.Options{Client: &kubernetes.Clientset{}, Hosts: []string{"node-a", "10.0.0.7"}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := g.TLSConfig().GetCertificate(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	leaf := cert.Leaf
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "node-a" || len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.ParseIP("10.0.0.7")) {
		t.Errorf("self-signed names %v %v, want node-a and 10.0.0.7", leaf.DNSNames, leaf.IPAddresses)
	}
	if d := time.Until(leaf.NotAfter); d < 364*24*time.Hour {
		t.Errorf("self-signed certificate valid for %v more, want a year", d)
	}
}
