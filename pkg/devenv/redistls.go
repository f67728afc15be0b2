package devenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// certificateLifetime is long enough for any test run and short enough
// that a leaked test key is worthless soon.
const certificateLifetime = 24 * time.Hour

// Certificates are PEM files of a private CA and one server certificate
// it signed.
type Certificates struct {
	CAFile, CertFile, KeyFile string
}

// WriteCertificates creates a CA and a server certificate for 127.0.0.1,
// ::1 and localhost in dir, as a private CA (a managed Redis's, say)
// would issue.
func WriteCertificates(dir string) (Certificates, error) {
	certs := Certificates{
		CAFile:   filepath.Join(dir, "ca.pem"),
		CertFile: filepath.Join(dir, "server.pem"),
		KeyFile:  filepath.Join(dir, "server-key.pem"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return certs, err
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "settle test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certificateLifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return certs, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return certs, err
	}
	serverKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return certs, err
	}
	serverTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certificateLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	serverDER, err := x509.CreateCertificate(rand.Reader, serverTemplate, ca, &serverKey.PublicKey, caKey)
	if err != nil {
		return certs, err
	}
	keyDER, err := x509.MarshalECPrivateKey(serverKey)
	if err != nil {
		return certs, err
	}
	files := []struct {
		path, kind string
		der        []byte
		mode       os.FileMode
	}{
		{certs.CAFile, "CERTIFICATE", caDER, 0o644},
		{certs.CertFile, "CERTIFICATE", serverDER, 0o644},
		{certs.KeyFile, "EC PRIVATE KEY", keyDER, 0o600},
	}
	for _, f := range files {
		data := pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der})
		if err := os.WriteFile(f.path, data, f.mode); err != nil {
			return certs, err
		}
	}
	return certs, nil
}

// RedisTLS is a redis-server that accepts only TLS connections, with a
// certificate from its own private CA and no client certificates
// required (tls-auth-clients no).
type RedisTLS struct {
	Port  int
	Dir   string
	Certs Certificates
	temp  bool
	proc  process
}

// StartRedisTLS creates a CA and a server certificate in a temp dir and
// starts redis-server on a TLS port only.
func StartRedisTLS(ctx context.Context) (*RedisTLS, error) {
	path, err := RedisServerPath()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "settle-redis-tls-")
	if err != nil {
		return nil, err
	}
	r := &RedisTLS{Dir: dir, temp: true}
	if r.Certs, err = WriteCertificates(dir); err != nil {
		r.cleanup()
		return nil, err
	}
	if r.Port, err = FreePort(); err != nil {
		r.cleanup()
		return nil, err
	}
	logPath := filepath.Join(dir, "redis.log")
	cmd := exec.Command(path,
		"--port", "0", "--tls-port", strconv.Itoa(r.Port), "--bind", "127.0.0.1",
		"--tls-cert-file", r.Certs.CertFile, "--tls-key-file", r.Certs.KeyFile,
		"--tls-ca-cert-file", r.Certs.CAFile, "--tls-auth-clients", "no",
		"--dir", dir, "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", logPath)
	if err := r.proc.start(cmd); err != nil {
		r.cleanup()
		return nil, fmt.Errorf("start redis with TLS: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := waitTCP(ctx, r.Addr(), r.proc.done); err != nil {
		r.Close()
		return nil, fmt.Errorf("%w (is redis-server built with TLS?)\n%s", err, tail(logPath, 20))
	}
	return r, nil
}

// Addr is host:port.
func (r *RedisTLS) Addr() string { return fmt.Sprintf("127.0.0.1:%d", r.Port) }

// URL is a rediss:// REDIS_URL for database db that trusts the server's
// private CA.
func (r *RedisTLS) URL(db int) string {
	return fmt.Sprintf("rediss://%s/%d?%s", r.Addr(), db, url.Values{"tls_ca_file": {r.Certs.CAFile}}.Encode())
}

// Close stops the server and removes its directory.
func (r *RedisTLS) Close() {
	r.proc.stop(syscall.SIGTERM, 10*time.Second)
	r.cleanup()
}

func (r *RedisTLS) cleanup() {
	if r.temp {
		_ = os.RemoveAll(r.Dir)
	}
}
