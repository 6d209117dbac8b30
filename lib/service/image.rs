//! The image a service runs: the local one its declaration names, or the
//! build of its `build = DIR` (one lw-build layer, cached by the hash of
//! its inputs).

use super::{Declaration, Services, Source};
use base::config::Project;
use base::error::{Error, Exit, Result};
use wall::image::{InputDecl, LayerDef, Runtime};

impl<'a> Services<'a> {
    /// The image of `d`: the local one it names, or its build (one lw-build
    /// layer, cached by the hash of its inputs).  Build output goes to `progress`.
    pub fn image(
        &self,
        project: &Project,
        d: &Declaration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(String, bool)> {
        match &d.source {
            Source::Image(r) => {
                if !self.engine.image_exists(r)? {
                    return Err(Error::new(
                        Exit::NoInput,
                        format!(
                            "image '{r}' of service '{}' is not in the engine; build or load it, or declare 'build = DIR' in {}",
                            d.name,
                            d.path.display()
                        ),
                    ));
                }
                Ok((r.clone(), false))
            }
            Source::Build { dir, from } => {
                let df = format!("{dir}/Dockerfile");
                let runtime = Runtime {
                    root: project.top.clone(),
                    image: format!("loopwright/service-{}", d.name),
                    def: wall::image::Definition {
                        image: None,
                        from: from.clone(),
                        layers: vec![LayerDef {
                            name: "image".into(),
                            line: 1,
                            dockerfile: df.clone(),
                            dockerfile_line: 1,
                            provider: None,
                            inputs: vec![InputDecl {
                                path: dir.clone(),
                                line: 1,
                            }],
                            context: None,
                            args: Vec::new(),
                            target: None,
                        }],
                    },
                };
                let mut plan = runtime.plan(self.images).map_err(|e| {
                    Error::new(
                        e.exit,
                        format!("service '{}' ({}): {}", d.name, d.path.display(), e.msg),
                    )
                })?;
                let tag = plan.final_tag().to_string();
                if plan.layers.iter().all(|l| l.cached()) {
                    return Ok((tag, false));
                }
                progress(&format!("building image {tag} for service '{}'", d.name));
                wall::image::build(
                    self.images,
                    &mut plan,
                    &mut wall::image::BuildOptions {
                        on_event: &mut |_, ev| {
                            if let engine::BuildEvent::Output(s) = ev {
                                for l in s.lines().filter(|l| l.starts_with("Step ")) {
                                    progress(l);
                                }
                            }
                        },
                        on_start: &mut |_| {},
                        // Built here, not pulled: the image cache is lw-build's.
                        fetch: None,
                    },
                )?;
                Ok((tag, true))
            }
        }
    }
}
