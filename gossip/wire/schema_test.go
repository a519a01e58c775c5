package wire_test

import (
	"crypto/sha256"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/meridian-quota/meridian/gcra"
	"github.com/meridian-quota/meridian/gossip/wire"
)

// loadSchema reads wire.proto with a parser for the subset it uses (flat
// messages and enums, scalar, enum and message fields) and builds its
// descriptor, so the tests below hold the hand-written codec to the
// committed schema through the protobuf runtime.
func loadSchema(t *testing.T) protoreflect.FileDescriptor {
	t.Helper()
	src, err := os.ReadFile("wire.proto")
	if err != nil {
		t.Fatal(err)
	}
	text := regexp.MustCompile(`//[^\n]*`).ReplaceAllString(string(src), "")
	pkg := regexp.MustCompile(`package\s+([\w.]+)\s*;`).FindStringSubmatch(text)[1]
	fd := &descriptorpb.FileDescriptorProto{Name: proto.String("wire.proto"), Package: proto.String(pkg), Syntax: proto.String("proto3")}
	scalars := map[string]descriptorpb.FieldDescriptorProto_Type{
		"uint32": descriptorpb.FieldDescriptorProto_TYPE_UINT32, "uint64": descriptorpb.FieldDescriptorProto_TYPE_UINT64,
		"int64": descriptorpb.FieldDescriptorProto_TYPE_INT64, "sint64": descriptorpb.FieldDescriptorProto_TYPE_SINT64,
		"fixed32": descriptorpb.FieldDescriptorProto_TYPE_FIXED32, "string": descriptorpb.FieldDescriptorProto_TYPE_STRING,
		"bytes": descriptorpb.FieldDescriptorProto_TYPE_BYTES, "bool": descriptorpb.FieldDescriptorProto_TYPE_BOOL,
	}
	enums := map[string]bool{}
	for _, m := range regexp.MustCompile(`enum\s+(\w+)\s*\{([^}]*)\}`).FindAllStringSubmatch(text, -1) {
		e := &descriptorpb.EnumDescriptorProto{Name: proto.String(m[1])}
		for _, v := range regexp.MustCompile(`(\w+)\s*=\s*(\d+)\s*;`).FindAllStringSubmatch(m[2], -1) {
			n, _ := strconv.Atoi(v[2])
			e.Value = append(e.Value, &descriptorpb.EnumValueDescriptorProto{Name: proto.String(v[1]), Number: proto.Int32(int32(n))})
		}
		enums[m[1]] = true
		fd.EnumType = append(fd.EnumType, e)
	}
	field := regexp.MustCompile(`^(repeated\s+)?(\w+)\s+(\w+)\s*=\s*(\d+)\s*;$`)
	for _, m := range regexp.MustCompile(`message\s+(\w+)\s*\{([^}]*)\}`).FindAllStringSubmatch(text, -1) {
		msg := &descriptorpb.DescriptorProto{Name: proto.String(m[1])}
		for _, line := range strings.Split(m[2], "\n") {
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			f := field.FindStringSubmatch(line)
			if f == nil {
				t.Fatalf("wire.proto: message %s: cannot parse %q", m[1], line)
			}
			n, _ := strconv.Atoi(f[4])
			fp := &descriptorpb.FieldDescriptorProto{Name: proto.String(f[3]), Number: proto.Int32(int32(n)),
				Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), JsonName: proto.String(f[3])}
			if f[1] != "" {
				fp.Label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
			}
			switch typ, ok := scalars[f[2]]; {
			case ok:
				fp.Type = typ.Enum()
			case enums[f[2]]:
				fp.Type, fp.TypeName = descriptorpb.FieldDescriptorProto_TYPE_ENUM.Enum(), proto.String("."+pkg+"."+f[2])
			default:
				fp.Type, fp.TypeName = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), proto.String("."+pkg+"."+f[2])
			}
			msg.Field = append(msg.Field, fp)
		}
		fd.MessageType = append(fd.MessageType, msg)
	}
	file, err := protodesc.NewFile(fd, new(protoregistry.Files))
	if err != nil {
		t.Fatalf("wire.proto: %v", err)
	}
	return file
}

// unmarshal decodes b as message name with the protobuf runtime and fails
// on any field the schema does not know (or knows with another type).
func unmarshal(t *testing.T, file protoreflect.FileDescriptor, name string, b []byte) *dynamicpb.Message {
	t.Helper()
	m := dynamicpb.NewMessage(file.Messages().ByName(protoreflect.Name(name)))
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var walk func(m protoreflect.Message, path string)
	walk = func(m protoreflect.Message, path string) {
		if len(m.GetUnknown()) > 0 {
			t.Fatalf("%s: fields unknown to wire.proto: %x", path, m.GetUnknown())
		}
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if fd.Kind() == protoreflect.MessageKind {
				if fd.IsList() {
					for i := range v.List().Len() {
						walk(v.List().Get(i).Message(), fmt.Sprintf("%s.%s[%d]", path, fd.Name(), i))
					}
				} else {
					walk(v.Message(), path+"."+string(fd.Name()))
				}
			}
			return true
		})
	}
	walk(m, name)
	return m
}

// get reads a field by name: scalars as int64/uint64/string/[]byte, lists
// as []any, messages as *dynamicpb.Message.
func get(m protoreflect.Message, name string) any {
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
	conv := func(v protoreflect.Value) any {
		switch fd.Kind() {
		case protoreflect.MessageKind:
			return v.Message()
		case protoreflect.EnumKind:
			return int64(v.Enum())
		case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
			return uint64(v.Uint())
		}
		return v.Interface()
	}
	v := m.Get(fd)
	if fd.IsList() {
		out := []any{}
		for i := range v.List().Len() {
			out = append(out, conv(v.List().Get(i)))
		}
		return out
	}
	return conv(v)
}

func TestSchemaMatchesEncoding(t *testing.T) {
	file := loadSchema(t)
	check := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: protobuf runtime reads %#v, want %#v", what, got, want)
		}
	}

	r := testReport(3, 10)
	r.Interval = -4
	r.Features, r.Delta = wire.FeatureInBase, true
	msgs, _ := wire.EncodeReport(cluster, r, -99, wire.DefaultMaxMessage)
	env := unmarshal(t, file, "Envelope", msgs[0])
	check("envelope version", get(env, "version"), uint64(1))
	check("envelope cluster", get(env, "cluster"), cluster)
	check("envelope kind", get(env, "kind"), int64(wire.KindReport))
	rep := unmarshal(t, file, "Report", get(env, "body").([]byte))
	check("region", get(rep, "region"), r.Region)
	check("agent", get(rep, "agent"), r.Agent)
	check("interval", get(rep, "interval"), r.Interval)
	check("term", get(rep, "term"), r.Term)
	check("epoch", get(rep, "epoch"), r.Epoch)
	check("policy_version", get(rep, "policy_version"), r.PolicyVersion)
	check("sent", get(rep, "sent"), int64(-99))
	check("count", get(rep, "count"), uint64(1))
	check("features", get(rep, "features"), uint64(wire.FeatureInBase))
	check("delta", get(rep, "delta"), true)
	keys := get(rep, "keys").([]any)
	check("keys", len(keys), len(r.Keys))
	for i, k := range keys {
		km := k.(protoreflect.Message)
		w := r.Keys[i]
		check("key", get(km, "key"), w.Key)
		check("offered", []any{get(km, "offered"), get(km, "offered_cost"), get(km, "admitted"), get(km, "denied")},
			[]any{w.Offered, w.OfferedCost, w.Admitted, w.Denied})
	}

	a := wire.Ack{Region: "eu", Agent: "a1", Term: 5, Epoch: 6, Sent: -1, Fence: gcra.Fence{Term: 5, Epoch: 7}, Store: 1 << 63}
	b, _ := wire.EncodeAck(cluster, a)
	ack := unmarshal(t, file, "Ack", get(unmarshal(t, file, "Envelope", b), "body").([]byte))
	check("ack", []any{get(ack, "region"), get(ack, "agent"), get(ack, "term"), get(ack, "epoch"), get(ack, "sent"),
		get(ack, "fence_term"), get(ack, "fence_epoch"), get(ack, "store")},
		[]any{a.Region, a.Agent, a.Term, a.Epoch, a.Sent, a.Fence.Term, a.Fence.Epoch, a.Store})

	tb := testTable(len(budgets), 8, "ap", "eu", "us")
	tb.Features, tb.Resync = wire.CoordDeltaReports, [][]string{nil, {"eu-2", "eu-3"}, nil}
	tb.BlindUntil = 8_250_000
	tmsgs, _ := wire.EncodeTable(cluster, tb, testKey, wire.DefaultMaxMessage)
	env = unmarshal(t, file, "Envelope", tmsgs[0])
	check("signature length", len(get(env, "signature").([]byte)), 64)
	tab := unmarshal(t, file, "Table", get(env, "body").([]byte))
	check("table term, epoch, index, count", []any{get(tab, "term"), get(tab, "epoch"), get(tab, "index"), get(tab, "count")},
		[]any{tb.Term, tb.Epoch, uint64(0), uint64(1)})
	h := get(tab, "header").(protoreflect.Message)
	check("issued, effective, policy", []any{get(h, "issued"), get(h, "effective"), get(h, "policy_version")},
		[]any{tb.Issued, tb.Effective, tb.PolicyVersion})
	check("regions", get(h, "regions"), []any{"ap", "eu", "us"})
	check("header features", get(h, "features"), uint64(wire.CoordDeltaReports))
	check("blind until", get(h, "blind_until"), tb.BlindUntil)
	resync := get(h, "resync").([]any)
	check("resync lists", len(resync), 3)
	check("resync", get(resync[1].(protoreflect.Message), "names"), []any{"eu-2", "eu-3"})
	check("leases", get(h, "leases"), []any{tb.Leases[0], tb.Leases[1], tb.Leases[2]})
	for r, al := range get(h, "agents").([]any) {
		want := []any{}
		for _, n := range tb.Agents[r] {
			want = append(want, n)
		}
		check("agents", get(al.(protoreflect.Message), "names"), want)
	}
	for i, k := range get(tab, "keys").([]any) {
		km := k.(protoreflect.Message)
		w := tb.Keys[i]
		check("key", get(km, "key"), w.Key)
		check("version", get(km, "version"), w.Version)
		var shares, bursts []any = []any{}, []any{}
		for _, s := range w.Shares {
			shares = append(shares, uint64(s))
		}
		for _, s := range w.Bursts {
			bursts = append(bursts, s)
		}
		check("shares", get(km, "shares"), shares)
		check("bursts", get(km, "bursts"), bursts)
		rate, period := w.Budget.Rate()
		var wantBudget []any
		if rate != 0 {
			wantBudget = []any{rate, period.Microseconds(), int64(0), w.Budget.Burst()}
		} else {
			wantBudget = []any{int64(0), int64(0), w.Budget.IntervalMicros(), w.Budget.Burst()}
		}
		check(fmt.Sprintf("budget %v", w.Budget), []any{get(km, "rate"), get(km, "period_us"), get(km, "interval_us"), get(km, "burst")}, wantBudget)
	}

	// A delta head: field 7 as the schema describes it, digest included.
	next := *tb
	next.Epoch++
	next.Keys = slices.Clone(tb.Keys[1:])
	next.Keys[0].Shares = []uint32{1, 2, 3}
	dmsgs, err := wire.EncodeTableFrom(cluster, &next, tb, testKey, wire.DefaultMaxMessage)
	if err != nil {
		t.Fatal(err)
	}
	dtab := unmarshal(t, file, "Table", get(unmarshal(t, file, "Envelope", dmsgs[0]), "body").([]byte))
	check("delta head rows, count", []any{len(get(dtab, "keys").([]any)), get(dtab, "count")}, []any{0, uint64(len(dmsgs))})
	d := get(dtab, "delta").(protoreflect.Message)
	digest := wire.TableDigest(next.Keys)
	check("delta base, digest, removed", []any{get(d, "base_term"), get(d, "base_epoch"), get(d, "digest"), get(d, "removed")},
		[]any{tb.Term, tb.Epoch, digest[:], []any{tb.Keys[0].Key}})
	changed := get(d, "changed").([]any)
	check("delta changed", len(changed), 1)
	check("delta changed row", []any{get(changed[0].(protoreflect.Message), "key"), get(changed[0].(protoreflect.Message), "shares")},
		[]any{next.Keys[0].Key, []any{uint64(1), uint64(2), uint64(3)}})
	// The digest is SHA-256 of the rows as the schema's runtime writes them.
	var rows []byte
	for _, k := range get(unmarshal(t, file, "Table", get(unmarshal(t, file, "Envelope", dmsgs[1]), "body").([]byte)), "keys").([]any) {
		one := dynamicpb.NewMessage(file.Messages().ByName("Table"))
		one.Mutable(file.Messages().ByName("Table").Fields().ByName("keys")).List().Append(protoreflect.ValueOfMessage(k.(protoreflect.Message)))
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(one)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, b...)
	}
	if len(dmsgs) == 2 {
		if sum := sha256.Sum256(rows); sum != digest {
			t.Errorf("digest %x, SHA-256 of the runtime's rows %x", digest, sum)
		}
	} else {
		t.Errorf("delta table of %d chunks; the check wants all rows in chunk 1", len(dmsgs))
	}

	// An in-base head: the delta's in_base, the base's count, no chunks.
	base, err := wire.EncodeTableBase(cluster, tb, nil, testKey, wire.DefaultMaxMessage, 0)
	if err != nil {
		t.Fatal(err)
	}
	ihead, ok, err := wire.EncodeTableOn(cluster, &next, tb, len(base), testKey, wire.DefaultMaxMessage, wire.Features)
	if err != nil || !ok {
		t.Fatalf("EncodeTableOn: %v, %v", ok, err)
	}
	itab := unmarshal(t, file, "Table", get(unmarshal(t, file, "Envelope", ihead), "body").([]byte))
	id := get(itab, "delta").(protoreflect.Message)
	check("in-base head rows, count, in_base, base", []any{len(get(itab, "keys").([]any)), get(itab, "count"), get(id, "in_base"), get(id, "base_epoch"), get(id, "digest")},
		[]any{0, uint64(len(base)), true, tb.Epoch, digest[:]})
	// Its changed row goes as a patch of the base's row 1 (the readers
	// all read FeatureRowPatches): place, shares and no key.
	if ch, ok := get(id, "changed").([]any); ok && len(ch) != 0 {
		t.Errorf("in-base head: %d whole rows changed, want them patched", len(ch))
	}
	patched := get(id, "patched").([]any)
	check("in-base head patched", len(patched), 1)
	pm := patched[0].(protoreflect.Message)
	check("in-base head patch", []any{get(pm, "index"), get(pm, "version_step"), get(pm, "shares")},
		[]any{uint64(1), int64(next.Keys[0].Version) - int64(tb.Keys[1].Version), []any{uint64(1), uint64(2), uint64(3)}})
	check("base head rows", len(get(unmarshal(t, file, "Table", get(unmarshal(t, file, "Envelope", base[0]), "body").([]byte)), "keys").([]any)), 0)

	// What the protobuf runtime writes from the schema (index 0 omitted,
	// fields in number order) decodes to the same values.
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(tab)
	if err != nil {
		t.Fatal(err)
	}
	m, err := wire.Decode(cluster, envelope(cluster, wire.KindTable, body, testKey), wire.DefaultLimits(), trusted)
	if err != nil {
		t.Fatal(err)
	}
	got := *m.Table.Header
	got.Keys = m.Table.Keys
	equalTables(t, &got, tb)
	body, _ = proto.Marshal(rep)
	m, err = wire.Decode(cluster, envelope(cluster, wire.KindReport, body, nil), wire.DefaultLimits(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !equalReports(&m.Report.Report, r) || m.Report.Sent != -99 {
		t.Fatalf("runtime-encoded report decodes to %+v", m.Report)
	}
}
