package region

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// FieldLines returns the problems of a validation error — sentinel joined
// with "field.path: message" errors, as the agent config's and the
// scenario's Validate return them — each prefixed with the field's line in
// doc ("line 7: redis.addr: …", go-yaml's own form for the unknown fields
// reported beside them) when the file has the field. The sentinel itself
// is left out: the caller wraps the result in it again.
func FieldLines(doc *yaml.Node, err, sentinel error) []error {
	var errs []error
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range u.Unwrap() {
			if e == sentinel {
				continue
			}
			if j, ok := e.(interface{ Unwrap() []error }); ok {
				errs = append(errs, j.Unwrap()...)
			} else {
				errs = append(errs, e)
			}
		}
	} else {
		errs = []error{err}
	}
	for i, e := range errs {
		path, _, ok := strings.Cut(e.Error(), ": ")
		if !ok {
			continue
		}
		first, _, _ := strings.Cut(path, ", ") // "grpc, http": the first field's line
		if line := FieldLine(doc, first); line > 0 {
			errs[i] = &lineError{msg: fmt.Sprintf("line %d: %s", line, e.Error()), err: e}
		}
	}
	return errs
}

// lineError is a validation problem with its line in the message.
type lineError struct {
	msg string
	err error
}

func (e *lineError) Error() string { return e.msg }
func (e *lineError) Unwrap() error { return e.err }

// FieldLine returns the line of the field at path ("redis.addr",
// "regions[1].name") in doc, or 0 when the file does not have it.
func FieldLine(doc *yaml.Node, path string) int {
	n := doc
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := 0
	for _, part := range strings.Split(path, ".") {
		name, idx, _ := strings.Cut(part, "[")
		if n == nil || n.Kind != yaml.MappingNode || name == "" || strings.ContainsAny(name, " ()") {
			return 0
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == name {
				line, next = n.Content[i].Line, n.Content[i+1]
			}
		}
		if next == nil {
			return 0
		}
		n = next
		for idx != "" {
			var s string
			s, idx, _ = strings.Cut(idx, "]")
			idx = strings.TrimPrefix(idx, "[")
			k := 0
			if _, err := fmt.Sscanf(s, "%d", &k); err != nil || n.Kind != yaml.SequenceNode || k < 0 || k >= len(n.Content) {
				return line
			}
			n = n.Content[k]
			line = n.Line
		}
	}
	return line
}
