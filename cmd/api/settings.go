package main

import "github.com/settle/settle/pkg/config"

// readArgs reads the settings of the subcommand args names (the empty
// command when args are not a usage of api).
func readArgs(args []string, env *config.Env) (command string, s settings) {
	switch {
	case len(args) == 0:
		command = "serve"
	case len(args) == 1 && args[0] == "migrate":
		command = "migrate"
	default:
		return "", settings{}
	}
	s = readCommon(env)
	if command == "serve" {
		readServe(env, &s)
	} else {
		s.migrateTimeout = env.Duration("MIGRATE_TIMEOUT", migrateTimeoutDefault)
	}
	return command, s
}
