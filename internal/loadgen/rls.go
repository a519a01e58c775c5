package loadgen

import (
	"context"
	"fmt"
	"net"
	"strconv"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// RLSTarget speaks Envoy RLS v3 to addr: each decision is one
// ShouldRateLimit for domain with one descriptor {descKey: "k<key>"}; a
// request is allowed when the overall code is OK. Any RLS server works.
// opts are added to the plaintext connection's (a bearer token's
// per-RPC credentials, say).
func RLSTarget(name, addr, domain, descKey string, opts ...grpc.DialOption) (Target, error) {
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		return Target{}, fmt.Errorf("loadgen: dial %s: %w", addr, err)
	}
	cl := rlsv3.NewRateLimitServiceClient(conn)
	return Target{
		Name: name,
		Decide: func(ctx context.Context, key int) (bool, error) {
			resp, err := cl.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain,
				Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{
					{Key: descKey, Value: "k" + strconv.Itoa(key)}}}}})
			if err != nil {
				return false, err
			}
			return resp.OverallCode == rlsv3.RateLimitResponse_OK, nil
		},
		Close: func() { _ = conn.Close() },
	}, nil
}

// noopRLS answers every request OK without any work: the floor an RLS
// server's throughput is measured against.
type noopRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (noopRLS) ShouldRateLimit(_ context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for range in.Descriptors {
		out.Statuses = append(out.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK})
	}
	return out, nil
}

// ServeNoopRLS serves a no-op RLS server on lis until ctx ends.
func ServeNoopRLS(ctx context.Context, lis net.Listener) error {
	s := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(s, noopRLS{})
	go func() {
		<-ctx.Done()
		s.GracefulStop()
	}()
	return s.Serve(lis)
}
