#!/bin/sh
# The consumer side of the contract: greets the user read from stdin.
sed -n 's/.*"name": *"\([^"]*\)".*/Hello, \1/p'
