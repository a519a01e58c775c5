// Command meridian is Meridian's one binary: the regional agent, the
// simulator, benchmarks and tools. Run `meridian --help` for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands lists the subcommands; each parses its own flags and answers
// --help.
var commands = []command{
	{"demo", "a whole cluster in one process — embedded NATS, three regions, live traffic — scored against the ideal limiter", runDemo},
	{"agent", "run a region's agent: Envoy RLS v3 and a JSON API deciding on the region's Redis", runAgent},
	{"gcra", "print the decision trace of a GCRA limit for a pattern of arrivals", runGCRA},
	{"bench", "benchmarks: `bench redis` (the Redis store beside redis_rate), `bench agent` (RLS servers), `bench noop-rls`", runBench},
	{"keys", "make a cluster's secrets: the coordinator's signing and verify keys, a memberlist key", runKeys},
	{"policy", "`policy check FILE|DIR`: validate a policy with every error and its line; --explain which rule a descriptor matches", runPolicy},
	{"sim", "simulate a scenario for every strategy and interval against the ideal global limiter", runSim},
	{"version", "print the version", runVersion},
}

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

// errUsage marks a usage error already reported on stderr (exit status 2).
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches args to a subcommand and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			return 2
		default:
			fmt.Fprintf(stderr, "meridian %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "meridian: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Meridian enforces global rate budgets across regions: each region decides")
	fmt.Fprintln(w, "locally with GCRA on its share, and a coordinator rebalances the shares.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: meridian <command> [flags]   (meridian <command> --help for its flags)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	cs := append([]command(nil), commands...)
	sort.Slice(cs, func(i, j int) bool { return cs[i].name < cs[j].name })
	for _, c := range cs {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
}

// newFlags returns a flag set for a subcommand that prints its usage to
// stderr (or stdout for --help) and returns errors instead of exiting.
func newFlags(name, synopsis string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("meridian "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: meridian %s [flags]\n\n%s\n\nFlags:\n", name, strings.TrimSpace(synopsis))
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args, turning a parse error into errUsage (the flag
// package has already printed it with the usage) and --help into
// flag.ErrHelp with the usage on stdout.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	for _, a := range args {
		if a == "-h" || a == "--help" || a == "-help" {
			fs.SetOutput(stdout)
			fs.Usage()
			return flag.ErrHelp
		}
	}
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "meridian %s: unexpected argument %q\n", strings.TrimPrefix(fs.Name(), "meridian "), fs.Arg(0))
		return errUsage
	}
	return nil
}

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", "Print the version of this binary.", stdout, stderr)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "meridian", version)
	return nil
}
