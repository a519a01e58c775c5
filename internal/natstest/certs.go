package natstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certs names PEM files of a throwaway PKI made by [NewCerts]: a CA, a
// server certificate for 127.0.0.1 and localhost, and a client certificate,
// all signed by the CA.
type Certs struct {
	CAFile                        string
	ServerCertFile, ServerKeyFile string
	ClientCertFile, ClientKeyFile string
	// VerifyClients makes a server started [WithTLS] require a client
	// certificate signed by the CA. NewCerts leaves it false.
	VerifyClients bool
}

// NewCerts writes a fresh CA, server and client certificate (ECDSA P-256,
// valid for one hour) into t.TempDir().
func NewCerts(t testing.TB) Certs {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	caKey, caCert, caDER := newCert(t, nil, nil, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "natstest CA"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
	})
	srvKey, _, srvDER := newCert(t, caKey, caCert, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "natstest server"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore:   now.Add(-time.Minute),
		NotAfter:    now.Add(time.Hour),
	})
	cliKey, _, cliDER := newCert(t, caKey, caCert, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "natstest client"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		NotBefore:   now.Add(-time.Minute),
		NotAfter:    now.Add(time.Hour),
	})
	c := Certs{
		CAFile:         filepath.Join(dir, "ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"),
		ServerKeyFile:  filepath.Join(dir, "server-key.pem"),
		ClientCertFile: filepath.Join(dir, "client.pem"),
		ClientKeyFile:  filepath.Join(dir, "client-key.pem"),
	}
	writePEM(t, c.CAFile, "CERTIFICATE", caDER)
	writePEM(t, c.ServerCertFile, "CERTIFICATE", srvDER)
	writePEM(t, c.ServerKeyFile, "EC PRIVATE KEY", marshalKey(t, srvKey))
	writePEM(t, c.ClientCertFile, "CERTIFICATE", cliDER)
	writePEM(t, c.ClientKeyFile, "EC PRIVATE KEY", marshalKey(t, cliKey))
	return c
}

// newCert creates a key and a certificate from tmpl, signed by parent (self
// signed when parent is nil).
func newCert(t testing.TB, parentKey *ecdsa.PrivateKey, parent, tmpl *x509.Certificate) (*ecdsa.PrivateKey, *x509.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("natstest: key: %v", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("natstest: serial: %v", err)
	}
	tmpl.SerialNumber = serial
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatalf("natstest: certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("natstest: parse certificate: %v", err)
	}
	return key, cert, der
}

func marshalKey(t testing.TB, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatalf("natstest: marshal key: %v", err)
	}
	return der
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("natstest: %v", err)
	}
}

// serverConfig is the server side of c.
func (c Certs) serverConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.ServerCertFile, c.ServerKeyFile)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("no certificate in " + c.CAFile)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, MinVersion: tls.VersionTLS12}
	if c.VerifyClients {
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}
