#!/bin/sh
# The consumer's scripted agent, run inside its sandbox (lw-sandbox exec).
# It waits on its inbox for the contract change, adapts its side, acks,
# commits, asks a person a question, and waits for the answer.
set -eu
cd /work/repo
say() { printf 'consumer: %s\n' "$*"; }

line=$(lw-inbox --wait --timeout "${WAIT:-300}" | head -n 1)
id=$(printf '%s\n' "$line" | cut -f 1)
say "received $(printf '%s\n' "$line" | cut -f 2-)"
lw-inbox show "$id" | sed 's/^/consumer:   | /'
# Adapt to the new field, the same change the contract made.
sed -i 's/"name"/"full_name"/' consumer/greet.sh
lw-inbox ack "$id" >/dev/null
git commit -qam "consumer: read user.full_name (contract change $id)"
say "adapted consumer/greet.sh and committed $(git rev-parse --short HEAD)"

q=$(lw-post --kind question --subject "keep reading the old 'name' field as a fallback?" \
    "Records written before the contract change still carry 'name'. Should greet.sh fall back to it?")
say "asked a person: $q"
line=$(lw-inbox --wait --timeout "${WAIT:-300}" | head -n 1)
aid=$(printf '%s\n' "$line" | cut -f 1)
answer=$(lw-inbox show "$aid" | sed '1,/^$/d')
lw-inbox ack "$aid" >/dev/null
say "answer: $answer"
case $answer in
[Yy]*)
    cat > consumer/greet.sh <<'SCRIPT'
#!/bin/sh
# The consumer side of the contract: greets the user read from stdin.
# Reads full_name, and falls back to name for records written before the change.
sed -n -e 's/.*"full_name": *"\([^"]*\)".*/Hello, \1/p;t' -e 's/.*"name": *"\([^"]*\)".*/Hello, \1/p'
SCRIPT
    git commit -qam "consumer: fall back to user.name, as answered in $aid"
    say "added the fallback and committed $(git rev-parse --short HEAD)"
    ;;
*) say "no fallback" ;;
esac
