#!/bin/sh
# The consumer's scripted agent, run inside its sandbox (lw-sandbox exec, or
# a real agent CLI's tool calls).  Usage: consumer.sh [start|work|adapt]
#
#   start  its own task first: it tightens the contract (a user's name must
#          not be empty) on the very line the producer is about to rename,
#          and commits: a deliberate conflict for lw-radar to find
#   work   one slow step of its task (an agent CLI runs it again and again
#          until the bell tells it of the contract change)
#   adapt  handles its mail as it comes: the contract change (adapt
#          consumer/greet.sh, ack, commit, ask a person a question), the
#          radar's conflict (drop its own edit of the contract: the
#          producer's rename wins), and the person's answer
#   review answers a person's review of its pull request (a request from
#          human, brought back by lw-sync pull): its reply goes to the
#          pull request's thread
#
# Without an argument: start, then adapt.
set -eu
cd /work/repo
say() { printf 'consumer: %s\n' "$*"; }

start() {
    sed -i 's/"name": { "type": "string" }/"name": { "type": "string", "minLength": 1 }/' contract/user.schema.json
    git commit -qam "consumer: a user's name must not be empty"
    say "tightened contract/user.schema.json (name: minLength 1) and committed $(git rev-parse --short HEAD)"
}

work() {
    sleep 2
    say "checked consumer/greet.sh against the stored records"
}

adapt() {
    adapted='' resolved='' answered=''
    while [ -z "$adapted" ] || [ -z "$resolved" ] || [ -z "$answered" ]; do
        line=$(lw-inbox --wait --timeout "${WAIT:-300}" | head -n 1)
        id=$(printf '%s\n' "$line" | cut -f 1)
        kind=$(printf '%s\n' "$line" | cut -f 3)
        say "received $(printf '%s\n' "$line" | cut -f 2-)"
        case $kind in
        contract-change)
            lw-inbox show "$id" | sed 's/^/consumer:   | /'
            # Adapt to the new field, the same change the contract made.
            sed -i 's/"name"/"full_name"/' consumer/greet.sh
            lw-inbox ack "$id" >/dev/null
            git commit -qam "consumer: read user.full_name (contract change $id)"
            say "adapted consumer/greet.sh and committed $(git rev-parse --short HEAD)"
            q=$(lw-post --kind question --subject "keep reading the old 'name' field as a fallback?" \
                "Records written before the contract change still carry 'name'. Should greet.sh fall back to it?")
            say "asked a person: $q"
            adapted=$id
            ;;
        conflict)
            lw-inbox show "$id" | sed 's/^/consumer:   | /'
            mine=$(git log --format=%h --grep="a user's name must not be empty" -n 1)
            git revert --no-edit "$mine" >/dev/null
            lw-inbox ack "$id" >/dev/null
            say "dropped its own edit of the contract ($mine): the producer's rename wins; committed $(git rev-parse --short HEAD)"
            resolved=$id
            ;;
        answer)
            answer=$(lw-inbox show "$id" | sed '1,/^$/d')
            lw-inbox ack "$id" >/dev/null
            say "answer: $answer"
            case $answer in
            [Yy]*)
                cat > consumer/greet.sh <<'SCRIPT'
#!/bin/sh
# The consumer side of the contract: greets the user read from stdin.
# Reads full_name, and falls back to name for records written before the change.
sed -n -e 's/.*"full_name": *"\([^"]*\)".*/Hello, \1/p;t' -e 's/.*"name": *"\([^"]*\)".*/Hello, \1/p'
SCRIPT
                git commit -qam "consumer: fall back to user.name, as answered in $id"
                say "added the fallback and committed $(git rev-parse --short HEAD)"
                ;;
            *) say "no fallback" ;;
            esac
            answered=$id
            ;;
        *)
            # Anything else (a conflict-cleared, a status) is news, not work.
            lw-inbox ack "$id" >/dev/null
            ;;
        esac
    done
}

review() {
    # News that came after the adapt step (a conflict-cleared) is acked on the way.
    while :; do
        line=$(lw-inbox --wait --timeout "${WAIT:-300}" | head -n 1)
        id=$(printf '%s\n' "$line" | cut -f 1)
        kind=$(printf '%s\n' "$line" | cut -f 3)
        [ -n "$id" ] || { echo "consumer.sh: no review came" >&2; exit 75; }
        lw-inbox ack "$id" >/dev/null
        [ "$kind" = request ] && break
    done
    say "received $(printf '%s\n' "$line" | cut -f 2-)"
    lw-inbox show "$id" | sed 's/^/consumer:   | /'
    r=$(lw-post --to human --kind status --reply-to "$id" --subject "Re: review of consumer/greet.sh" \
        "The fallback to user.name stays until every stored record is migrated, as a person answered; greet.sh reads full_name first.")
    say "answered the review in the pull request's thread: $r"
}

case ${1:-all} in
start) start ;;
work) work ;;
adapt) adapt ;;
review) review ;;
all) start && adapt ;;
*) echo "consumer.sh: unknown step '$1' (start, work, adapt, review)" >&2; exit 64 ;;
esac
