//go:build invariants

package main

// invariantsEnabled: see TestSoak.
const invariantsEnabled = true
