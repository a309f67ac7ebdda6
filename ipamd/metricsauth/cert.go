package metricsauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// certSource hands the listener its certificate at each handshake.
type certSource interface {
	get(*tls.ClientHelloInfo) (*tls.Certificate, error)
}

// selfSigned is a certificate made once, in memory.
type selfSigned struct{ cert *tls.Certificate }

func (s selfSigned) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cert, nil }

// SelfSignedValidity is how long the self-signed certificate is valid; the
// daemon makes a new one at every start.
const SelfSignedValidity = 365 * 24 * time.Hour

// newSelfSigned makes an ECDSA P-256 certificate for hosts (IP addresses
// go in the IP SANs, anything else in the DNS SANs), valid from an hour
// before now (clock skew) for SelfSignedValidity.
func newSelfSigned(hosts []string, now time.Time) (certSource, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("metricsauth: certificate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("metricsauth: certificate serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "vpcipd metrics"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(SelfSignedValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("metricsauth: self-signed certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("metricsauth: self-signed certificate: %w", err)
	}
	return selfSigned{&tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}}, nil
}

// dirCert is the pair tls.crt, tls.key of a directory, loaded again when
// either file's modification time or size changes (a mounted Secret is
// updated by swapping a symlink, which Stat follows). A pair that fails to
// load keeps the last good one serving, logged.
type dirCert struct {
	crt, key string
	log      *slog.Logger

	mu    sync.Mutex // guards the fields below
	stamp string     // modification times and sizes of the loaded pair
	cert  *tls.Certificate
}

func newDirCert(dir string, log *slog.Logger) (certSource, error) {
	d := &dirCert{crt: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key"), log: log}
	if _, err := d.load(); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *dirCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return d.load()
}

// load returns the pair, reading it when its files changed.
func (d *dirCert) load() (*tls.Certificate, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	stamp, err := d.stampNow()
	if err == nil && stamp == d.stamp && d.cert != nil {
		return d.cert, nil
	}
	if err == nil {
		var c tls.Certificate
		if c, err = tls.LoadX509KeyPair(d.crt, d.key); err == nil {
			d.cert, d.stamp = &c, stamp
			return d.cert, nil
		}
	}
	err = fmt.Errorf("metricsauth: certificate %s and key %s: %w", d.crt, d.key, err)
	if d.cert == nil {
		return nil, err
	}
	d.log.Warn("metrics: keeping the last good certificate", "err", err)
	return d.cert, nil
}

func (d *dirCert) stampNow() (string, error) {
	a, err := os.Stat(d.crt)
	if err != nil {
		return "", err
	}
	b, err := os.Stat(d.key)
	if err != nil {
		return "", err
	}
	return fmt.Sprint(a.ModTime().UnixNano(), a.Size(), b.ModTime().UnixNano(), b.Size()), nil
}
