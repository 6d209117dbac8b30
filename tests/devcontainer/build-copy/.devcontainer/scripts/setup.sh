apt-get update
