package main

// devCommands are built only with the dev tag (`go build -tags dev`):
// they link the simulated chain, throwaway servers and the load tool,
// which have no place in the production image.
var devCommands = map[string]bool{"dev": true, "demo": true, "load": true}
