# Shell functions the demo scripts share (sourced, not run): `step` prints a banner; `verify_all
# <when>` runs `consistent-stream verify` on each model of the array `models`, with `$bin` the
# virtualenv's bin directory and the dbt project the current directory; `example_copy` below.
step() { printf '\n==== %s ====\n' "$*"; }

verify_all() {
    for model in "${models[@]}"; do
        step "verify $model ($1)"
        "$bin/consistent-stream" verify "$model" --project-dir "$PWD"
    done
}

# example_copy DIR PYTHON: DIR (created) becomes a copy of models/example (dbt_project.yml,
# profiles.yml, models, tests) whose models rebuild on the executors (`driver_rebuild_rows: 0`,
# set by PYTHON, which has PyYAML), as the cluster demos run them; `$repo` is the repository.
example_copy() {
    local dir=$1 python=$2
    mkdir "$dir"
    cp -r "$repo/models/example/"{dbt_project.yml,profiles.yml,models,macros,tests} "$dir/"
    "$python" - "$dir/dbt_project.yml" <<'PY'
import sys
import yaml
path = sys.argv[1]
with open(path) as f:
    project = yaml.safe_load(f)
project["models"][project["name"]]["+driver_rebuild_rows"] = 0
with open(path, "w") as f:
    yaml.safe_dump(project, f, sort_keys=False)
PY
}
