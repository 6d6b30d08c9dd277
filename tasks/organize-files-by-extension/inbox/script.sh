content of script.sh
