//go:build !invariants

package main

const invariantsEnabled = false
