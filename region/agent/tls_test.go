package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// certs writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all PEM, to dir; it returns the CA pool and the client's
// key pair.
func certs(t *testing.T, dir string) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	caKey := key()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	write("ca.pem", "CERTIFICATE", caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (tls.Certificate, []byte, []byte) {
		k := key()
		tpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(k)
		pair, err := tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
		if err != nil {
			t.Fatal(err)
		}
		return pair, der, kb
	}
	_, sDER, sKey := leaf("server", 2, x509.ExtKeyUsageServerAuth)
	write("server.pem", "CERTIFICATE", sDER)
	write("server-key.pem", "EC PRIVATE KEY", sKey)
	client, _, _ := leaf("client", 3, x509.ExtKeyUsageClientAuth)
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return pool, client
}

func TestMutualTLSOnBothProtocols(t *testing.T) {
	dir := t.TempDir()
	pool, clientCert := certs(t, dir)
	a, _, _ := startWith(t, func(c *Config) {
		c.TLS = TLSConfig{CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem"),
			ClientCAFile: filepath.Join(dir, "ca.pem")}
	})
	gl, _ := net.Listen("tcp", "127.0.0.1:0")
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, gl, hl) }()
	t.Cleanup(func() { cancel(); <-done })
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc(nil, "tenant", "x")}}
	for _, withCert := range []bool{true, false} {
		cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if withCert {
			cfg.Certificates = []tls.Certificate{clientCert}
		}
		conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, req)
		ccancel()
		conn.Close()
		if withCert && err != nil {
			t.Errorf("RLS with a client certificate: %v", err)
		}
		if !withCert && err == nil {
			t.Error("RLS without a client certificate was served")
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 5 * time.Second}
		resp, err := hc.Post("https://"+hl.Addr().String()+"/v1/decide", "application/json",
			strings.NewReader(`{"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "x"}]}]}`))
		if withCert && (err != nil || resp.StatusCode != 200) {
			t.Errorf("HTTP with a client certificate: %v %v", resp, err)
		}
		if !withCert && err == nil {
			t.Errorf("HTTP without a client certificate was served: %d", resp.StatusCode)
		}
		if resp != nil {
			resp.Body.Close()
		}
	}
}
