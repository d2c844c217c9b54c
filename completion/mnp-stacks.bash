# Bash completion for this project's invoke tasks: task names and options (from invoke's own
# completion); after an option, the values its declaration gives (`invoke stacks --values
# OPTION`: after --stack the stacks of the stacks file, honouring a --stacks FILE or
# --stacks=FILE given earlier on the line; after --instance-type the instance table's types;
# after --launcher, --scheduler, --kind, --ranks, --rdzv the values the tasks check them against).
#   source completion/mnp-stacks.bash        # in ~/.bashrc, with the project's venv on PATH
# Works for `invoke ...`, `inv ...` and `./dev invoke ...`. Each Tab runs one invoke process that
# imports no Docker, AWS or JSON Schema library (tests/test_cli.py checks), so it stays quick.

_mnp_stacks_complete() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="" words=() i runner=(invoke) stacks_file=""
    [ "$COMP_CWORD" -gt 0 ] && prev="${COMP_WORDS[COMP_CWORD-1]}"
    # `--stack=cpu<Tab>`: bash splits at "=" (COMP_WORDBREAKS), so the option is two words back
    if [ "$cur" = "=" ]; then
        prev="${COMP_WORDS[COMP_CWORD-1]}" cur=""
    elif [ "$prev" = "=" ] && [ "$COMP_CWORD" -gt 1 ]; then
        prev="${COMP_WORDS[COMP_CWORD-2]}"
    fi
    words=("${COMP_WORDS[@]}")
    if [ "${words[0]}" = "./dev" ]; then
        # The checkout's venv command, never ./dev itself: where .venv is missing or older than
        # pyproject.toml (a fresh clone; CI, which installs with pip and has no .venv), ./dev
        # first creates it and pip-installs the project, a minute or more, so a Tab hung that
        # long (and tests/test_cli.py's completions ran past their 120 s under load). Without
        # a .venv, the command on PATH answers (CI's), or nothing does; ./dev installs on Enter.
        runner=(invoke)
        [ "${words[1]}" = "mnp-stacks" ] && runner=(mnp-stacks)
        [ -x ".venv/bin/${runner[0]}" ] && runner=(".venv/bin/${runner[0]}")
        words=("${words[@]:1}")            # complete `./dev invoke ...` as `invoke ...`
        [ "${#words[@]}" -le 1 ] && { COMPREPLY=($(compgen -W "invoke mnp-stacks" -- "$cur")); return 0; }
    elif [ "${words[0]##*/}" = "mnp-stacks" ]; then
        runner=("${words[0]}")             # the installed command (any directory), as typed
    fi
    for ((i = 1; i < ${#words[@]} - 1; i++)); do   # a stacks file given earlier on the line
        case "${words[i]}" in
            --stacks)
                if [ "${words[i+1]}" = "=" ]; then stacks_file="${words[i+2]}"
                else stacks_file="${words[i+1]}"; fi ;;
            --stacks=*) stacks_file="${words[i]#--stacks=}" ;;  # "=" not a word break here
        esac
    done
    case "$prev" in
        --stacks|--metadata-file|--ca-bundle|--output)
            COMPREPLY=($(compgen -f -- "$cur"))
            return 0 ;;
        --*)
            # the values the option's declaration gives (the stacks file's stacks, the instance
            # table's types, the launchers, a writer's kinds or rank starters...); none for an
            # option that takes any value, and then invoke's own completion below
            local values
            values="$("${runner[@]}" stacks --values "${prev#--}" --stacks "${stacks_file:-stacks.yaml}" 2>/dev/null)"
            if [ -n "$values" ]; then
                COMPREPLY=($(compgen -W "$values" -- "$cur"))
                return 0
            fi ;;
    esac
    COMPREPLY=($(compgen -W "$("${runner[@]}" --complete -- "${words[@]}" 2>/dev/null)" -- "$cur"))
}

# mnp-stacks: the installed command running the same tasks (matrix/cli/program.py)
complete -F _mnp_stacks_complete -o default invoke inv ./dev mnp-stacks
