// Package plugin is the aether-cni binary's logic (CNI spec 1.1: ADD, DEL, CHECK, GC, STATUS,
// VERSION) and its client of the agent's unix socket; the wire protocol itself is
// api/aether/cni/v1, which the agent imports too.
//
// It must stay small: the plugin runs once per pod start inside the kubelet's CNI chain, so it
// imports neither package model nor client-go (their package init costs milliseconds per exec).
// It never changes the prevResult it passes through and writes nothing but the CNI result to
// stdout. The agent side (server, store, installer) is package cni.
package plugin
