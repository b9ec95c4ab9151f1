# Shell functions the demo scripts share (sourced, not run): `step` prints a banner; `verify_all
# <when>` runs `consistent-stream verify` on each model of the array `models`, with `$bin` the
# virtualenv's bin directory and the dbt project the current directory.
step() { printf '\n==== %s ====\n' "$*"; }

verify_all() {
    for model in "${models[@]}"; do
        step "verify $model ($1)"
        "$bin/consistent-stream" verify "$model" --project-dir "$PWD"
    done
}
