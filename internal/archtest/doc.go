// Package archtest holds the tests that enforce the import direction of
// ARCHITECTURE.md ("Packages" and "Import direction"): which module packages
// and third-party modules each package's non-test files may import. It has no
// non-test code.
//
// The rules are data in imports_test.go. A package follows the rule of its
// nearest listed ancestor directory; a package outside internal/ and cmd/ that
// no rule covers fails the test until ARCHITECTURE.md names it and the table
// here encodes it.
package archtest
