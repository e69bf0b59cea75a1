#!/usr/bin/env bash
# Publish the generated notebooks (_build/notebooks, written by `make notebooks`) as the branch
# that the Colab and Binder buttons open (`ppbook_notebooks_branch` in _config.yml), as one new
# commit on top of it, without touching the checkout; then push it (PUSH=0: commit only).
#   bash tools/publish_notebooks.sh notebooks
set -euo pipefail
branch=${1:?usage: publish_notebooks.sh BRANCH}
src=${NOTEBOOKS_DIR:-_build/notebooks}
if [ ! -d "$src/book" ]; then
  echo "publish_notebooks.sh: error: no $src/book: run \`make book\` and \`make notebooks\` first" >&2
  exit 2
fi
git_dir=$(git rev-parse --absolute-git-dir)
head=$(git rev-parse --short HEAD)
index=$(mktemp -u)
trap 'rm -f "$index"' EXIT
tree=$(cd "$src" && GIT_DIR="$git_dir" GIT_INDEX_FILE="$index" git --work-tree=. add -A . &&
       GIT_DIR="$git_dir" GIT_INDEX_FILE="$index" git write-tree)
parent=$(git rev-parse -q --verify "refs/heads/$branch" || true)
commit=$(git commit-tree "$tree" ${parent:+-p "$parent"} -m "Notebooks generated from $head (make notebooks)")
git update-ref "refs/heads/$branch" "$commit"
echo "branch $branch: $commit (notebooks of $head)"
if [ "${PUSH:-1}" = 1 ]; then git push origin "$branch"; fi
