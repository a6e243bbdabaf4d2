// Package semconvtest is an empty stand-in; see go.mod.
package semconvtest
