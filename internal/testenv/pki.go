package testenv

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
)

// PKI is a certificate authority made for one test and the certificates it
// signed, written as PEM files (keys mode 0600) into a t.TempDir. Every
// call makes a new CA, so a second PKI is a CA that trusts none of the
// first one's certificates. Certificates are valid from an hour before the
// call to an hour after; keys are ECDSA P-256. Nothing here runs openssl.
type PKI struct {
	// Dir holds the files.
	Dir string
	// CAFile is the CA's certificate.
	CAFile string
	// ServerCertFile and ServerKeyFile are a server certificate for
	// 127.0.0.1, ::1 and localhost (IP and DNS SANs), usage server auth.
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate (CN
	// "meridian-test-client"), usage client auth.
	ClientCertFile, ClientKeyFile string

	pool   *x509.CertPool
	client tls.Certificate
}

// NewPKI makes a CA and its server and client certificates.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	dir := t.TempDir()
	p := &PKI{Dir: dir, CAFile: filepath.Join(dir, "ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"), ServerKeyFile: filepath.Join(dir, "server-key.pem"),
		ClientCertFile: filepath.Join(dir, "client.pem"), ClientKeyFile: filepath.Join(dir, "client-key.pem")}
	fail := func(what string, err error) {
		if err != nil {
			t.Fatalf("testenv: PKI: %s: %v", what, err)
		}
	}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		fail("key", err)
		return k
	}
	write := func(path, typ string, der []byte) {
		fail("write "+path, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
	}
	serial := func() *big.Int {
		n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
		fail("serial", err)
		return n
	}
	now := time.Now()
	caKey := key()
	caTpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "meridian test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	fail("CA certificate", err)
	ca, err := x509.ParseCertificate(caDER)
	fail("CA certificate", err)
	write(p.CAFile, "CERTIFICATE", caDER)
	p.pool = x509.NewCertPool()
	p.pool.AddCert(ca)

	leaf := func(certFile, keyFile, cn string, usage x509.ExtKeyUsage, ips []net.IP, dns []string) {
		k := key()
		tpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips, DNSNames: dns}
		der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &k.PublicKey, caKey)
		fail(cn+" certificate", err)
		kder, err := x509.MarshalPKCS8PrivateKey(k)
		fail(cn+" key", err)
		write(certFile, "CERTIFICATE", der)
		write(keyFile, "PRIVATE KEY", kder)
	}
	leaf(p.ServerCertFile, p.ServerKeyFile, "localhost", x509.ExtKeyUsageServerAuth,
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, []string{"localhost"})
	leaf(p.ClientCertFile, p.ClientKeyFile, "meridian-test-client", x509.ExtKeyUsageClientAuth, nil, nil)
	p.client, err = tls.LoadX509KeyPair(p.ClientCertFile, p.ClientKeyFile)
	fail("client key pair", err)
	return p
}

// ClientTLS returns a client configuration that trusts only the CA and
// presents the client certificate.
func (p *PKI) ClientTLS() *tls.Config {
	return &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{p.client}, MinVersion: tls.VersionTLS12}
}
